"""Whether a relaunch of a multi-node job waits for a takeover (launch._agents_gone): pure
over a real job store and real processes."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from trainguard.controller.store import JobStore
from trainguard.controller.store_rows import NodeRow
from trainguard.launch import _agents_gone
from trainguard.states import NodeState

T = datetime(2026, 12, 5, tzinfo=timezone.utc)


def rows(pids: list[int], backend: str = "local") -> list[NodeRow]:
    return [NodeRow(f"node-{i}", "vm", NodeState.HEALTHY, pid, i, None, T, backend)
            for i, pid in enumerate(pids)]


def test_a_relaunch_after_stop_ended_the_agents_does_not_wait_for_them(tmp_path: Path) -> None:
    """Walk-through 26: after `stop` had ended a lost job's agents, the same command waited
    20 s in silence for them to reconnect."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    with JobStore.create(tmp_path / "a", "r") as store:
        store.put_nodes(rows([gone.pid, gone.pid]), replace=True)
        assert _agents_gone(store) == "none of its node agents runs any more"
    # an agent that still runs (here: a process named as node-0's agent) may reconnect
    agent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)",
                              "trainguard.node.main", "--node", "node-0"],
                             start_new_session=True)
    try:
        with JobStore.create(tmp_path / "b", "r") as store:
            store.put_nodes(rows([agent.pid, gone.pid]), replace=True)
            assert _agents_gone(store) is None
        with JobStore.create(tmp_path / "c", "r") as store:  # Slurm: nobody here can tell
            store.put_nodes(rows([gone.pid], backend="slurm"), replace=True)
            assert _agents_gone(store) is None
    finally:
        agent.kill()
        agent.wait()
