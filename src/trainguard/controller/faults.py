"""What a fault is to the records: its scenario, when it happened (`fault_time`), who it
touched, and the reasons an attempt ends with (a stop, a lost launcher). Pure: no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from trainguard.diagnosis.taxonomy import Diagnosis, Evidence
from trainguard.protocol import Progress, WorkerFact
from trainguard.records import FaultScenario

_CHIP_CATEGORIES = {"gpu_hardware", "npu_hardware_or_driver"}
# the end of an attempt whose launcher died, closed by the next launch of the job
LOST_END_REASON = "lost: its launcher died; ended at its last sign of life"
# the end of an attempt the user stopped (`trainguard stop`, Ctrl-C): `stopped_by(SIGTERM)`
STOPPED_BY = "launcher received"
# the reason of a broken group's record (every process lived; `diagnose JOB_DIR` reads it)
GROUP_FAILED_REASON = "the process group failed on "


def stopped_by(signal_name: str) -> str:
    return f"{STOPPED_BY} {signal_name}"


def fault_scenario(diag: Diagnosis) -> FaultScenario:
    if diag.category.value in _CHIP_CATEGORIES:
        return FaultScenario.CHIP_FAULT
    if diag.isolate_node:
        return FaultScenario.NODE_FAULT
    if diag.from_log:
        return FaultScenario.ERROR_IN_LOG
    return FaultScenario.JOB_FAILED


@dataclass(frozen=True)
class Fault:
    """What an incident's records say of the fault itself."""

    scenario: FaultScenario
    reason: str  # the recover record's reason
    end_reason: str  # the running record's end reason
    related_task: str  # worker-N, node/NAME or job
    fault_at: datetime  # the first sign (a worker's exit, the last progress before a hang)
    detected: datetime
    stopped: datetime  # the attempt's workers were stopped
    progress: Progress
    category: str | None = None


def fault_time(failed: list[WorkerFact], evidence: Evidence | None,
               default: datetime) -> datetime:
    """When a crash happened: the first failed rank's exit, or, when earlier, when the
    deciding line was written by a failed rank (one that printed its error, then spent
    seconds tearing down before it exited: walk-through 24 counted those as a step cut short
    and 0.2 s to detect); never a line from before that rank's last step began (it trained
    past it)."""
    first = min((w.ended_at for w in failed if w.ended_at), default=default)
    at = evidence.at if evidence is not None else None
    rank = next((w for w in failed if evidence is not None and w.rank == evidence.rank), None)
    if at is not None and rank is not None and at < first and (
            rank.second_last_step_at is None or at >= rank.second_last_step_at):
        return at
    return first


def task_of(rank: int | None) -> str:
    return "job" if rank is None else f"worker-{rank}"
