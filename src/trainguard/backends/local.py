"""The embedded backend: N "virtual nodes" on this machine, one agent process per node.

Each agent runs in its own session (its own process group), so killing a node is killing
that group: the agent dies, and its guardian kills the node's workers. Isolation keeps the
node out of the job's placement (there is no cluster to drain it from). An agent adopted by
PID (a restarted controller's) is signalled only while that PID still leads its group and
runs `trainguard.node.main --node NODE`: a PID reused by another process is never killed.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
from pathlib import Path

import psutil

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

    def kill(self) -> None:
        pid = self.pid
        if pid is not None and not self.ended():
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
        if self._proc is not None:
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
