"""The local backend's adopted agents (audit D8): a restarted controller adopts agent PIDs
from the store; a PID that another process took since is never signalled."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainguard.backends.local import LocalBackend

SLEEP = "import time; time.sleep(60)"


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    out: list[subprocess.Popen[bytes]] = []
    yield out
    for p in out:
        p.kill()
        p.wait()


def start(procs: list[subprocess.Popen[bytes]], *argv: str) -> subprocess.Popen[bytes]:
    p = subprocess.Popen([sys.executable, "-c", SLEEP, *argv], start_new_session=True)
    procs.append(p)
    return p


def test_a_reused_pid_leading_a_group_is_never_killed(
        tmp_path: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    stranger = start(procs)  # a shell, tmux, another job: leads its own group
    agent = LocalBackend(2, tmp_path).adopt_agent("node-0", stranger.pid)
    assert agent.ended()  # not our agent: ours is gone
    agent.kill()
    assert stranger.poll() is None


def test_an_adopted_agent_of_that_node_is_killed(
        tmp_path: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    other_node = start(procs, "trainguard.node.main", "--node", "node-1")
    real = start(procs, "trainguard.node.main", "--node", "node-0")
    backend = LocalBackend(2, tmp_path)
    assert backend.adopt_agent("node-0", other_node.pid).ended()
    agent = backend.adopt_agent("node-0", real.pid)
    assert not agent.ended()
    agent.kill()
    assert real.wait(5) == -9
