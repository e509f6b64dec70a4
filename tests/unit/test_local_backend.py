"""The local backend's adopted agents (audit D8): a restarted controller adopts agent PIDs
from the store; a PID that another process took since is never signalled, not even when
it is taken between the identity check and the signal."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from trainguard.backends import local
from trainguard.backends.local import LocalBackend

NS_LAST_PID = Path("/proc/sys/kernel/ns_last_pid")  # the PID the kernel gave out last

SLEEP = "import time; time.sleep(60)"


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    out: list[subprocess.Popen[bytes]] = []
    yield out
    for p in out:
        p.kill()
        p.wait()


def start(procs: list[subprocess.Popen[bytes]], *argv: str) -> subprocess.Popen[bytes]:
    """The process once it runs its own command: between fork and exec it still shows this
    one's command line and group (CI under load adopted it there and found no agent)."""
    p = subprocess.Popen([sys.executable, "-c", SLEEP, *argv], start_new_session=True)
    procs.append(p)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if SLEEP in psutil.Process(p.pid).cmdline() and os.getpgid(p.pid) == p.pid:
                return p
        except (psutil.Error, OSError):
            pass
        time.sleep(0.01)
    raise AssertionError(f"pid {p.pid} did not exec its command within 30 s")


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


def test_an_adopted_agent_is_killed_with_the_rest_of_its_group(
        tmp_path: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    spawns = ("import subprocess, sys, time; "
              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
              "time.sleep(60)")
    real = subprocess.Popen([sys.executable, "-c", spawns, "trainguard.node.main", "--node",
                             "node-0"], start_new_session=True)
    procs.append(real)
    deadline = time.monotonic() + 10
    while not psutil.Process(real.pid).children() and time.monotonic() < deadline:
        time.sleep(0.02)
    child = psutil.Process(real.pid).children()[0]  # in the agent's group
    LocalBackend(2, tmp_path).adopt_agent("node-0", real.pid).kill()
    assert real.wait(5) == -9
    gone, _ = psutil.wait_procs([child], timeout=5)
    assert gone and gone[0].returncode in (-9, None)


def start_as(procs: list[subprocess.Popen[bytes]], pid: int) -> subprocess.Popen[bytes]:
    """A stranger leading its own group under `pid`, which must be free: the kernel is told
    to give out `pid` next (ns_last_pid, root); retried while other processes take it."""
    for _ in range(100):
        NS_LAST_PID.write_text(str(pid - 1))
        p = start(procs)
        if p.pid == pid:
            return p
        p.kill()
        p.wait()
    pytest.skip(f"PID {pid} kept being taken by other processes")


@pytest.mark.skipif(not os.access(NS_LAST_PID, os.W_OK),
                    reason="choosing the next PID (ns_last_pid) needs root")
def test_a_pid_reused_right_after_the_identity_check_is_never_killed(
        tmp_path: Path, procs: list[subprocess.Popen[bytes]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The race: the check finds our agent, then the agent ends and its PID goes to a
    stranger leading its own group (a shell, tmux) before the signal is sent."""
    agent = start(procs, "trainguard.node.main", "--node", "node-0")
    strangers: list[subprocess.Popen[bytes]] = []
    real_check = local.is_agent_of

    def check_then_reuse(pid: int, node: str) -> bool:
        ours = real_check(pid, node)  # the real check, on the real process
        if ours and not strangers:  # ...and right after it, the PID changes hands
            agent.kill()
            agent.wait()
            strangers.append(start_as(procs, pid))
        return ours

    monkeypatch.setattr(local, "is_agent_of", check_then_reuse)
    LocalBackend(2, tmp_path).adopt_agent("node-0", agent.pid).kill()
    assert strangers, "the check never ran"
    with pytest.raises(subprocess.TimeoutExpired):  # alive: the signal went to the old agent
        code = strangers[0].wait(0.5)
        pytest.fail(f"the stranger with the agent's PID ended with {code}")


def test_an_agent_without_its_controller_knocks_less_and_less_often() -> None:
    """(walk-through 23) Agents retried the handshake about 5 times a second for as long as
    no controller answered; now they back off (0.2 s doubling to 2 s) with jitter."""
    from trainguard.node.main import RETRY_FIRST_S, RETRY_MAX_S, retry_wait

    for tries, base in ((0, RETRY_FIRST_S), (1, 2 * RETRY_FIRST_S), (3, 8 * RETRY_FIRST_S),
                        (4, RETRY_MAX_S), (1000, RETRY_MAX_S)):
        waits = [retry_wait(tries) for _ in range(200)]
        assert all(0.75 * base <= w <= 1.25 * base for w in waits), (tries, min(waits))
        assert len(set(waits)) > 100  # jittered: agents do not knock in step
