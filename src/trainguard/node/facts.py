"""Facts about an ended or running worker that the agent reads from the system: the
kernel's OOM-kill count, torch's error file, the failure findings of its log, a channel
datagram as a WorkerMessage, and a worker's WorkerFact for the agent's NodeReport."""

from __future__ import annotations

import contextlib
import json
import logging
import subprocess
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from trainguard.diagnosis.context import CONTEXT_LINES
from trainguard.diagnosis.findings import Finding
from trainguard.diagnosis.sources import scan_file, scan_lines
from trainguard.node.logs import LogRouter
from trainguard.protocol import WorkerAssignment, WorkerFact, WorkerMessage
from trainguard.records import utcnow
from trainguard.states import StopCause, WorkerState
from trainguard.worker.contract import MessageKind

log = logging.getLogger(__name__)

SCAN_TAIL_BYTES = 64 << 20  # a failed rank's log is scanned from this far before its end


@dataclass
class Worker:
    """One rank's process as the agent keeps it."""

    assignment: WorkerAssignment
    proc: subprocess.Popen[bytes]
    started_at: datetime
    error_file: Path
    state: WorkerState = WorkerState.RUNNING
    ended_at: datetime | None = None
    returncode: int | None = None
    oom_killed: bool | None = None
    log: Path | None = None
    findings: list[Finding] | None = None  # the scan of its log, once it ended
    standby: bool = False  # a pre-warmed standby took this rank (else a cold start)
    stopped_by: StopCause | None = None  # a STOPPED rank's: who stopped it


def worker_fact(node: str, w: Worker, router: LogRouter | None, job_dir: Path | None,
                second_last_step_at: datetime | None = None) -> WorkerFact:
    """What the controller is told of one worker; an ended one's log findings included."""
    failed = w.state.ended and w.state != WorkerState.SUCCEEDED
    return WorkerFact(
        rank=w.assignment.rank, node=node, local_rank=w.assignment.local_rank,
        pid=w.proc.pid, state=w.state, returncode=w.returncode, started_at=w.started_at,
        ended_at=w.ended_at, start_count=w.assignment.start_count, standby=w.standby,
        findings=_findings(w, router, job_dir) if failed else [],
        error_file=read_error_file(w.error_file) if w.state.ended else None,
        oom_killed=w.oom_killed, second_last_step_at=second_last_step_at,
        stopped_by=w.stopped_by,
    )


def _findings(w: Worker, router: LogRouter | None, job_dir: Path | None) -> list[Finding]:
    """Scan a failed rank's log; once its pipes are closed the result is kept."""
    if w.findings is not None:
        return w.findings
    # the pipe may still hold its last lines (a child of the worker can keep it open)
    complete = router is None or router.wait_rank_eof(w.assignment.rank, timeout=0.5)
    found = log_findings(w.log, w.assignment.rank, job_dir, router)
    if complete:
        w.findings = found
    return found


def log_findings(path: Path | None, rank: int, job_dir: Path | None,
                 router: LogRouter | None) -> list[Finding]:
    """The failure findings of an ended rank's log (its end: a failure shows there), and of
    the router's in-memory tail when the file lost lines (a full disk)."""
    found: list[Finding] = []
    name = f"rank-{rank}.log"
    if path is not None:
        name = path.name
        with contextlib.suppress(ValueError):
            name = str(path.relative_to(job_dir)) if job_dir else name
        try:
            found = scan_file(path, name, rank=rank, tail_bytes=SCAN_TAIL_BYTES,
                              context_lines=CONTEXT_LINES)
        except OSError as e:
            log.warning("cannot scan the log of rank %d (%s): %s", rank, path, e)
    if router is not None and not router.file_complete(rank):
        found += scan_lines(router.tail(rank), f"{name} (memory tail)", rank)
    return found


def worker_message(raw: dict[str, Any]) -> WorkerMessage:
    at = raw.get("at")
    when = (datetime.fromtimestamp(at, timezone.utc) if isinstance(at, (int, float))
            else utcnow())
    rank = raw.get("rank")
    data = {k: v for k, v in raw.items() if k not in ("kind", "rank", "at")}
    return WorkerMessage(kind=str(raw["kind"]), rank=rank if isinstance(rank, int) else None,
                         at=when, data=data)


def oom_kill_count(vmstat: Path = Path("/proc/vmstat")) -> int | None:
    """The kernel's count of OOM kills since boot (Linux 4.13+); None where unknown."""
    try:
        for line in vmstat.read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def read_error_file(path: Path) -> dict[str, object] | None:
    """torch's @record error file, if the worker wrote one (unreadable -> None)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def log_errors(router: LogRouter | None) -> list[WorkerMessage]:
    """The rank logs' write failures since the last call, as messages to the controller."""
    errors = router.take_errors() if router is not None else []
    return [WorkerMessage(kind=MessageKind.LOG_WRITE_FAILED, rank=None, at=utcnow(),
                          data={"error": e}) for e in errors]
