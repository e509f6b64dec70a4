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
from trainguard.protocol import StartWorkers, WorkerAssignment
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
            master_port=1, max_restarts=0, log_dir=str(tmp_path / "logs"),
            job_dir=str(tmp_path), checkpoint_dir=str(tmp_path / "ck"),
            workers=[WorkerAssignment(rank=0, local_rank=0, start_count=1, schedule_count=1)])
        with pytest.raises(ValueError):
            agent._spawn(cmd, cmd.workers[0], BrokenRouter(), tmp_path / "logs")  # type: ignore[arg-type]
        (proc,) = spawned
        assert proc.wait(timeout=10) < 0  # stopped by a signal, not left sleeping
    finally:
        agent.close()
