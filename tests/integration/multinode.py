"""What the multi-node tests on the local backend share: the job's arguments (2 nodes of 2
ranks, real DDP over gloo), the controller in the background, and reads of its status and
events (tests/integration/test_multinode_local.py, test_multinode_agents.py,
test_memory_snapshots.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.integration.conftest import EXAMPLE, TG, read_json

XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."


def job_args(job_dir: Path, *extra: str, steps: int = 60) -> list[str]:
    return ["run", "--nnodes", "2", "--nproc-per-node", "2", "--job-dir", str(job_dir),
            "--run-id", "mn", "--max-restarts", "3", "--grace-period", "5", *extra,
            str(EXAMPLE), "--steps", str(steps), "--step-time", "0.1", "--ckpt-every", "10",
            "--progress", "--quiet"]


class Background:
    """The controller in the background, its console in a file (the node agents inherit it
    and outlive a killed controller, so a pipe would stay open)."""

    def __init__(self, args: list[str], cwd: Path, name: str = "console",
                 fault: str | None = None) -> None:
        env = dict(os.environ)
        env.pop("TRAINGUARD_FAULT", None)
        if fault is not None:
            env["TRAINGUARD_FAULT"] = fault
        self.console = cwd / f"{name}.log"
        with open(self.console, "w") as out:
            self.proc = subprocess.Popen([*TG, *args], cwd=cwd, env=env, stdout=out,
                                         stderr=subprocess.STDOUT)

    def finish(self, timeout: float = 180) -> tuple[int, str]:
        code = self.proc.wait(timeout=timeout)
        return code, self.console.read_text()


def wait_for(job_dir: Path, pred: Any, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (job_dir / "trainguard.db").exists():
            status = read_json("status", job_dir)
            if pred(status):
                return status  # type: ignore[no-any-return]
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting on {job_dir}")


def node(status: dict[str, Any], name: str) -> dict[str, Any]:
    return next(n for n in status["nodes"] if n["name"] == name)


def events_of(job_dir: Path, reason: str) -> list[dict[str, Any]]:
    return [e for e in read_json("events", job_dir) if e["reason"] == reason]


def kill_node(status: dict[str, Any], name: str) -> None:
    os.killpg(node(status, name)["agent_pid"], signal.SIGKILL)


def log_of(job_dir: Path, attempt: int, rank: int) -> str:
    return (job_dir / "logs" / f"attempt-{attempt}" / f"rank-{rank}.log").read_text()
