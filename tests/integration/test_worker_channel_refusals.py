"""A real job's worker channel knocked on by processes that are not the job's: each datagram
is refused and counted where an operator looks (`status`, its `--json`, `metrics`), not only
in the agent's log (docs/security.md W3's leftover); the job trains on."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.integration.conftest import EXAMPLE, TG, read_json
from trainguard.worker.contract import ENV_SOCKET

SEND_AS = """
import os, socket, sys
os.setuid(int(sys.argv[2]))
socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b'{"kind": "resumed", "step": 1}',
                                                        "\\0" + sys.argv[1][1:])
"""


def _wait_status(job: Path, pred: Callable[[dict[str, Any]], bool],
                 timeout: float = 90.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        if (job / "trainguard.db").is_file():
            try:
                status = read_json("status", job)
                if pred(status):
                    return status
            except subprocess.CalledProcessError:
                pass
        time.sleep(0.3)
    raise AssertionError(f"timed out; the last status: {status}")


def _agent_socket(pid: int) -> str:
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return next(v.split(b"=", 1)[1].decode() for v in environ
                if v.startswith(ENV_SOCKET.encode() + b"="))


def test_datagrams_from_outside_the_job_are_refused_and_counted_in_status_and_metrics(
        tmp_path: Path) -> None:
    job = tmp_path / "job"
    launcher = subprocess.Popen(
        [*TG, "run", "--nproc-per-node", "1", "--job-dir", str(job), str(EXAMPLE),
         "--steps", "400", "--step-time", "0.1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        status = _wait_status(job, lambda s: (s["last_progress"]["step"] or 0) >= 2
                              and s["ranks"] and s["ranks"][0]["pid"])
        assert status["worker_messages_refused"] == 0
        name = _agent_socket(status["ranks"][0]["pid"])
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)  # this user, not the job's
        for junk in (b'{"kind": "resumed", "step": 1}', b"\xff not json"):
            s.sendto(junk, "\0" + name[1:])
        sent = 2
        if os.getuid() == 0:  # another user
            subprocess.run([sys.executable, "-c", SEND_AS, name, "65534"], check=True,
                           timeout=30)
            sent += 1
        status = _wait_status(job, lambda s: s["worker_messages_refused"] >= sent)
        assert status["worker_messages_refused"] == sent and status["state"] == "running"
        text = subprocess.run([*TG, "status", str(job)], capture_output=True, text=True,
                              timeout=60, check=True).stdout
        assert f"worker messages refused: {sent} (a stranger's" in text, text
        metrics = subprocess.run([*TG, "metrics", str(job)], capture_output=True, text=True,
                                 timeout=60, check=True).stdout
        assert re.search(rf"^trainguard_worker_messages_refused_total {sent}\.0$", metrics,
                         re.M), metrics
    finally:
        launcher.terminate()
        launcher.wait(timeout=60)
