"""A worker the agent spawned is never left running when it cannot be routed (node/agent.py):
walk-through 27 found a rank, spawned as the launcher crashed on its log router, training on
alone, orphaned, 12 minutes later."""

from __future__ import annotations

import io
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from trainguard.node import agent as agent_mod
from trainguard.node.agent import NodeAgent
from trainguard.node.logs import ConsoleOptions
from trainguard.protocol import StartWorkers, StopWorkers, WorkerAssignment
from trainguard.spec import DEFAULT_STEP_PATTERN


class BrokenRouter:
    def add(self, *args: Any) -> None:
        raise ValueError("I/O operation on closed epoll object")


def test_a_spawned_worker_the_router_cannot_take_is_killed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent_mod.procs, "become_subreaper", lambda: False)  # not pytest
    spawned: list[subprocess.Popen[bytes]] = []
    real = agent_mod.procs.spawn

    def spawn(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        spawned.append(real(*args, **kwargs))
        return spawned[-1]

    monkeypatch.setattr(agent_mod.procs, "spawn", spawn)
    agent = NodeAgent("n0", io.StringIO(), ConsoleOptions({}), DEFAULT_STEP_PATTERN,
                      f"spawn-{time.monotonic_ns()}")
    try:
        cmd = StartWorkers(
            run_id="r", attempt=0, argv=[sys.executable, "-c", "import time; time.sleep(60)"],
            env={}, world_size=1, group_rank=0, group_world_size=1, master_addr="127.0.0.1",
            master_port=1, max_restarts=0, grace_s=1, log_dir=str(tmp_path / "logs"),
            job_dir=str(tmp_path), checkpoint_dir=str(tmp_path / "ck"),
            workers=[WorkerAssignment(rank=0, local_rank=0, start_count=1, schedule_count=1)])
        with pytest.raises(ValueError):
            agent._spawn(cmd, cmd.workers[0], BrokenRouter(), tmp_path / "logs")  # type: ignore[arg-type]
        (proc,) = spawned
        assert proc.wait(timeout=10) < 0  # stopped by a signal, not left sleeping
    finally:
        agent.close()


def test_a_newer_attempt_s_start_stops_the_workers_its_stop_did_not_reach(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 42 #1: a restart's stop gave up on a node cut off from the controller; its
    agent came back with the last attempt's workers running and refused the start ("workers
    of the last attempt still run"): the node was drained. A start of a newer attempt now
    stops them first, with the job's grace period (review 43 #5: a fixed 5 s cut a save on
    the way out short); one of the same attempt is still refused."""
    monkeypatch.setattr(agent_mod.procs, "become_subreaper", lambda: False)  # not pytest
    agent = NodeAgent("n0", io.StringIO(), ConsoleOptions({}), DEFAULT_STEP_PATTERN,
                      f"stale-{time.monotonic_ns()}")
    stops: list[StopWorkers] = []
    real_stop = agent.stop_workers

    def stop_workers(cmd: StopWorkers, meanwhile: Any = None) -> Any:
        stops.append(cmd)
        return real_stop(cmd, meanwhile)

    monkeypatch.setattr(agent, "stop_workers", stop_workers)

    def start(attempt: int) -> StartWorkers:
        return StartWorkers(
            run_id="r", attempt=attempt, argv=[sys.executable, "-c", "import time; "
                                               "time.sleep(60)"],
            env={}, world_size=1, group_rank=0, group_world_size=1, master_addr="127.0.0.1",
            master_port=1, max_restarts=1, grace_s=0.7, log_dir=str(tmp_path / "logs"),
            job_dir=str(tmp_path), checkpoint_dir=str(tmp_path / "ck"),
            workers=[WorkerAssignment(rank=0, local_rank=0, start_count=attempt + 1,
                                      schedule_count=1)])

    try:
        first = agent.start_workers(start(0)).workers[0].pid
        with pytest.raises(agent_mod.LaunchError, match="attempt 0 while its workers"):
            agent.start_workers(start(0))
        second = agent.start_workers(start(1)).workers[0].pid
        assert second != first and not agent_mod.procs.group_alive(first)
        assert [(c.grace_s, c.reason) for c in stops] == [(0.7, "a newer attempt")]
    finally:
        agent.close()
