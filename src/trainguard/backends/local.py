"""The embedded backend: N "virtual nodes" on this machine, one agent process per node.

Each agent runs in its own session (its own process group), so killing a node is killing
that group: the agent dies, and its guardian kills the node's workers. Isolation keeps the
node out of the job's placement (there is no cluster to drain it from). An agent adopted by
PID (a restarted controller's) is signalled only while that PID still leads its group and
runs `trainguard.node.main --node NODE`, and through pidfds taken before that check: a PID
reused by another process, even right after the check, is never killed (audit D8).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import select
import signal
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol, TypeVar

import psutil

from trainguard.backends.base import AGENT_ENDED

AGENT_MODULE = "trainguard.node.main"


def is_agent_of(pid: int, node: str) -> bool:
    """`pid` is a live node agent of `node` leading its own group (not a reused PID)."""
    try:
        p = psutil.Process(pid)
        argv = p.cmdline()
        if p.status() == psutil.STATUS_ZOMBIE or os.getpgid(pid) != pid:
            return False
    except (psutil.Error, OSError):
        return False
    pairs = set(itertools.pairwise(argv))
    return AGENT_MODULE in argv and ("--node", node) in pairs


class AgentRow(Protocol):
    """What a job store's node row says of its agent (controller/store_rows.NodeRow)."""

    @property
    def name(self) -> str: ...
    @property
    def agent_pid(self) -> int | None: ...
    @property
    def backend(self) -> str: ...


R = TypeVar("R", bound=AgentRow)


def live_agents(rows: Iterable[R]) -> list[R]:
    """The rows whose node agent still runs on this machine (the local backend's: a Slurm
    node's runs elsewhere, where nobody here can tell): they outlive a killed launcher,
    waiting for a controller to take the job over, and their workers train on."""
    return [r for r in rows if r.backend == LocalBackend.name and r.agent_pid is not None
            and is_agent_of(r.agent_pid, r.name)]


def signal_agent(pid: int, node: str, sig: int = signal.SIGKILL) -> bool:
    """Send `sig` to `node`'s agent `pid` and the rest of its process group, only while it
    is that agent; False when it is not (ended, or the PID is another process's now).
    A pidfd names one process for good: it is taken before the check, the check holds only
    if that process still runs after it, and the signals go through pidfds, so a PID reused
    between the check and the signal is never hit. Without pidfds (Linux < 5.3) the check,
    then killpg: a reuse in those microseconds is the limit there."""
    try:
        leader = os.pidfd_open(pid)
    except (AttributeError, OSError) as e:
        if isinstance(e, OSError) and e.errno != errno.ENOSYS:
            return False  # gone (ESRCH), or no fd left: never fall back to the race
        if not is_agent_of(pid, node):  # no pidfds on this system
            return False
        with contextlib.suppress(OSError):
            os.killpg(pid, sig)
        return True
    fds = [leader]
    try:
        if not is_agent_of(pid, node) or _exited(leader):
            return False
        fds += _group_members(pid, leader)
        for fd in fds:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(fd, sig)
        return True
    finally:
        for fd in fds:
            os.close(fd)


def _exited(pidfd: int) -> bool:
    p = select.poll()
    p.register(pidfd, select.POLLIN)  # readable once the process has exited
    return bool(p.poll(0))


def _group_members(pgid: int, leader: int) -> list[int]:
    """pidfds of the other processes in the group that the live process behind `leader`
    leads (a group id is a PID: while its leader runs, no other group can have it)."""
    fds: list[int] = []
    for pid in psutil.pids():
        try:
            if pid == pgid or os.getpgid(pid) != pgid:
                continue
            fd = os.pidfd_open(pid)
        except OSError:
            continue
        try:
            member = os.getpgid(pid) == pgid and not _exited(fd) and not _exited(leader)
        except OSError:
            member = False
        if member:
            fds.append(fd)
        else:
            os.close(fd)
    return fds


class LocalAgent:
    def __init__(self, node: str, proc: subprocess.Popen[bytes] | None, pid: int | None) -> None:
        self.node, self._proc, self._pid = node, proc, pid

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else self._pid

    def ended(self) -> bool:
        if self._proc is not None:
            return self._proc.poll() is not None
        return self._pid is None or not is_agent_of(self._pid, self.node)

    def why_ended(self) -> str:
        return AGENT_ENDED

    def cancelled(self) -> str | None:  # no cluster ends a local agent
        return None

    def kill(self, wait: bool = True) -> None:  # SIGKILL: it ends at once either way
        if self._proc is None:  # adopted: its PID may be anyone's now
            if self._pid is not None:
                signal_agent(self._pid, self.node)
            return
        if self._proc.poll() is None:  # our child: its PID is ours until we reap it
            with contextlib.suppress(OSError):
                os.killpg(self._proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=5)


class LocalBackend:
    name = "local"

    def __init__(self, nodes: int, log_dir: Path) -> None:
        self._names = [f"node-{i}" for i in range(nodes)]
        self._log_dir = log_dir

    def node_names(self) -> list[str]:
        return list(self._names)

    def start_agent(self, node: str, argv: list[str]) -> LocalAgent:
        self._log_dir.mkdir(parents=True, exist_ok=True)
        with open(self._log_dir / f"{node}.agent.log", "ab") as err:
            proc = subprocess.Popen([*argv, "--node", node], stdin=subprocess.DEVNULL,
                                    stderr=err, start_new_session=True, close_fds=True)
        return LocalAgent(node, proc, proc.pid)

    def adopt_agent(self, node: str, pid: int | None) -> LocalAgent:
        return LocalAgent(node, None, pid)

    def bad_nodes(self) -> dict[str, str]:
        return {}

    def isolate(self, node: str, reason: str) -> str:
        return "kept out of the job's placement (local backend)"

    def close(self) -> None:
        return None
