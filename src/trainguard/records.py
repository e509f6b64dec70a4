"""What the job store holds: events, running records and recover records.

Shapes follow ARCHITECTURE.md (Vocabulary): Kubernetes-style events, and the managed
platform's running/recover records extended with the time split of each incident (the job's
state and the other lifecycles: trainguard.states). Pure data: no I/O here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import Enum
from typing import Any


class Level(str, Enum):
    INFO = "Info"
    WARNING = "Warning"
    ERROR = "Error"


BY_CLUSTER = "by_cluster"  # JobStopped's data: the cluster's stop (queued after), not a person's


class Reason(str, Enum):
    """Stable event reasons (CamelCase, as Kubernetes events)."""

    JOB_CREATED = "JobCreated"
    JOB_RELAUNCHED = "JobRelaunched"
    SETTINGS_CHANGED = "SettingsChanged"  # a relaunch whose settings differ from the last's
    JOB_RUNNING = "JobRunning"
    WORKER_FAILED = "WorkerFailed"
    FAILURE_DIAGNOSED = "FailureDiagnosed"
    RESTART_SCHEDULED = "RestartScheduled"
    WORKERS_RESTARTED = "WorkersRestarted"
    RESTART_LIMIT_REACHED = "RestartLimitReached"
    NO_PROGRESS = "NoProgress"
    JOB_SUCCEEDED = "JobSucceeded"
    JOB_FAILED = "JobFailed"
    JOB_STOPPED = "JobStopped"
    WORKERS_STOPPED = "WorkersStopped"
    STOP_REQUESTED = "StopRequested"  # the launcher got SIGTERM/SIGINT/SIGHUP: stopping
    DRAIN_REQUESTED = "DrainRequested"  # a stop: ranks that drain save, then exit, first
    CHECKPOINT_SAVED = "CheckpointSaved"
    CHECKPOINT_SAVE_FAILED = "CheckpointSaveFailed"
    CHECKPOINT_SAVE_SKIPPED = "CheckpointSaveSkipped"
    CHECKPOINT_CORRUPT = "CheckpointCorrupt"
    CHECKPOINT_MISSING = "CheckpointMissing"
    RESUMED = "Resumed"
    LOG_WRITE_FAILED = "LogWriteFailed"
    CONTROL_UNREACHABLE = "ControlUnreachable"  # a rank its agent's verdicts cannot reach
    STORE_WRITE_FAILED = "StoreWriteFailed"
    JOB_DIR_LOW_ON_SPACE = "JobDirLowOnSpace"  # no room for the store's last writes (reserve)
    NO_PROGRESS_SIGNAL = "NoProgressSignal"  # ranks print, none reports a step
    HANG_SUSPECTED = "HangSuspected"
    HANG_CONFIRMED = "HangConfirmed"
    HANG_CLEARED = "HangCleared"
    HANG_RESTART_LIMIT_REACHED = "HangRestartLimitReached"
    NODE_READY = "NodeReady"
    NODE_LOST = "NodeLost"
    NODE_ISOLATED = "NodeIsolated"
    POD_RESCHEDULED = "PodRescheduled"
    JOB_RESCHEDULED = "JobRescheduled"
    RESCHEDULE_DOWNGRADED = "RescheduleDowngraded"
    QUEUING = "Queuing"
    PRECHECK_STARTED = "PrecheckStarted"
    PRECHECK_COMPLETED = "PrecheckCompleted"
    PRECHECK_FAILED = "PrecheckFailed"
    CONTROLLER_RESTARTED = "ControllerRestarted"
    CONTROLLER_STALLED = "ControllerStalled"  # it did not run: nothing was heard meanwhile
    LINKS_DOWN, LINKS_RESTORED = "LinksDown", "LinksRestored"  # a full disruption, its end
    STEP_RETRYING = "StepRetrying"  # rung 0: the ranks re-form their group, re-run the step
    STEP_REEXECUTED = "StepReexecuted"  # the re-executed step succeeded on every rank
    STEP_RETRY_DOWNGRADED = "StepRetryDowngraded"  # no re-execution: the next rung takes over
    IN_PROCESS_RESTARTING = "InProcessRestarting"  # one rank starts again, the rest re-enter
    IN_PROCESS_RESTARTED = "InProcessRestarted"  # every rank entered its function again
    FAULTS_NOT_FIRED = "FaultsNotFired"  # a job succeeded with TRAINGUARD_FAULT's faults unfired
    AUTO_RESUME_UNUSED = "AutoResumeUnused"  # --auto-resume of the other framework's Trainer


class FaultScenario(str, Enum):
    CHIP_FAULT = "chip_fault"
    NODE_FAULT = "node_fault"
    JOB_FAILED = "job_failed"
    JOB_HANGED = "job_hanged"
    JOB_SUBHEALTH = "job_subhealth"
    ERROR_IN_LOG = "error_in_log"


class RecoverResult(str, Enum):
    RECOVERING = "recovering"
    SUCCESS = "success"
    FAILED = "failed"
    DOWNGRADE = "downgrade"
    TERMINATED = "terminated"
    QUOTA_EXCEEDED = "quotaExceeded"


# a recover record's `recover` when no rung of the ladder acted on the incident: the job
# gave up at once, or a confirmed hang was left running (`--restart-on-hang` off)
NO_RECOVERY = "none"


class StartType(str, Enum):
    FIRST_START = "first_start"
    RELAUNCH = "relaunch"  # the same job (run id, job dir) launched again, e.g. requeued
    AUTO_RESTART = "auto_restart"
    UNCONDITIONAL_RESTART = "unconditional_restart"
    SUSPENSION_RESTART = "suspension_restart"  # restart upon a confirmed hang
    POD_RESCHEDULE = "pod_reschedule"  # a lost node's ranks moved to a spare
    JOB_RESCHEDULE = "job_reschedule"  # a faulty node isolated, every rank placed again


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def iso(t: datetime | None) -> str | None:
    """ISO 8601 with time zone, or None."""
    return None if t is None else t.astimezone(timezone.utc).isoformat(timespec="milliseconds")


def from_iso(s: str | None) -> datetime | None:
    return None if s is None else datetime.fromisoformat(s)


def secs(v: object, missing: str = "?") -> str:
    """A duration as events and the CLI show it (`1.234s`); `missing` when not a number."""
    return f"{v:.3f}s" if isinstance(v, (int, float)) else missing


def rank_list(ranks: Iterable[int]) -> str:
    """Ranks as events and the CLI show them: `0, 1` (never a Python list)."""
    return ", ".join(map(str, ranks))


def plural(n: int, noun: str) -> str:
    """`1 restart`, `3 restarts`."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def size_text(n: float) -> str:
    """Bytes as people read them: 512 B, 3.2 MiB, 1.5 GiB."""
    for unit in ("B", "KiB", "MiB"):
        if round(n, 1 if unit != "B" else 0) < 1024:  # (1023.96 KiB reads 1.0 MiB)
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


@dataclass(frozen=True)
class Involved:
    """What an event is about (job, node, rank, attempt); None where it does not apply."""

    job: str
    node: str | None = None
    rank: int | None = None
    attempt: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Involved:
        return cls(job=d["job"], node=d.get("node"), rank=d.get("rank"), attempt=d.get("attempt"))


@dataclass(frozen=True)
class Event:
    time: datetime
    level: Level
    reason: str
    message: str
    involved: Involved
    data: dict[str, Any] | None = None  # structured details (a diagnosis, stack dumps...)

    def to_dict(self) -> dict[str, Any]:
        d = {
            "time": iso(self.time),
            "level": self.level.value,
            "reason": self.reason,
            "message": self.message,
            "involved": self.involved.to_dict(),
        }
        if self.data is not None:
            d["data"] = self.data
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Event:
        """Inverse of to_dict."""
        return cls(
            time=_required_time(d["time"]),
            level=Level(d["level"]),
            reason=d["reason"],
            message=d["message"],
            involved=Involved.from_dict(d["involved"]),
            data=d.get("data"),
        )


@dataclass
class RecoverRecord:
    """One incident: from the fault to the first progress after recovery."""

    attempt: int  # the attempt whose failure started this incident
    recover_start_at: datetime
    fault_scenario: FaultScenario
    reason: str
    related_task: str
    recover: str = "process_restart"
    recover_result: RecoverResult = RecoverResult.RECOVERING
    recover_end_at: datetime | None = None
    # time split: fault -> detected -> workers stopped -> decided -> (backoff) -> workers
    # started -> first progress. Deciding waits for the stop so every rank's facts are in.
    fault_at: datetime | None = None
    detected_at: datetime | None = None
    workers_stopped_at: datetime | None = None
    decided_at: datetime | None = None
    backoff_s: float | None = None
    workers_started_at: datetime | None = None
    first_progress_at: datetime | None = None
    last_step_before: int | None = None
    resumed_step: int | None = None
    steps_lost: int | None = None
    category: str | None = None
    workers_from: str | None = None  # the restarted workers: "standby", "cold" or "mixed"
    resumed_from: str | None = None  # their state: "memory" or "storage" (checkpoint loads)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, datetime):
                v = iso(v)
            elif isinstance(v, Enum):
                v = v.value
            out[f.name] = v
        out["durations_s"] = self.durations()
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RecoverRecord:
        """Inverse of to_dict; derived keys (durations_s) and unknown keys are ignored."""
        kwargs: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name in d:
                kwargs[f.name] = d[f.name]
        for name in _RECOVER_TIMES:
            if name in kwargs:
                kwargs[name] = from_iso(kwargs[name])
        kwargs["recover_start_at"] = _required_time(d["recover_start_at"])
        kwargs["fault_scenario"] = FaultScenario(d["fault_scenario"])
        if "recover_result" in kwargs:
            kwargs["recover_result"] = RecoverResult(kwargs["recover_result"])
        return cls(**kwargs)

    def durations(self) -> dict[str, float | None]:
        def span(a: datetime | None, b: datetime | None) -> float | None:
            return None if a is None or b is None else round((b - a).total_seconds(), 3)

        return {
            "detect": span(self.fault_at, self.detected_at),
            "stop": span(self.detected_at, self.workers_stopped_at),
            "decide": span(self.workers_stopped_at, self.decided_at),
            "start": span(self.decided_at, self.workers_started_at),
            "resume": span(self.workers_started_at, self.first_progress_at),
            "total": span(self.fault_at or self.recover_start_at, self.first_progress_at),
        }


@dataclass
class RunningRecord:
    """One attempt: how it started, how it ended and what recovery followed."""

    attempt: int
    start_at: datetime
    start_type: StartType
    end_at: datetime | None = None
    end_reason: str | None = None
    end_related_task: str | None = None
    end_recover: str | None = None
    master_port: int | None = None
    first_step: int | None = None
    last_step: int | None = None
    first_output_at: datetime | None = None  # a rank's first output line: bounds a script
    recover_records: list[RecoverRecord] = field(default_factory=list)  # with no step reports

    def to_dict(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "start_at": iso(self.start_at),
            "end_at": iso(self.end_at),
            "start_type": self.start_type.value,
            "end_reason": self.end_reason,
            "end_related_task": self.end_related_task,
            "end_recover": self.end_recover,
            "master_port": self.master_port,
            "first_step": self.first_step,
            "last_step": self.last_step,
            "first_output_at": iso(self.first_output_at),
            "recover_records": [r.to_dict() for r in self.recover_records],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunningRecord:
        """Inverse of to_dict."""
        return cls(
            attempt=d["attempt"],
            start_at=_required_time(d["start_at"]),
            start_type=StartType(d["start_type"]),
            end_at=from_iso(d.get("end_at")),
            end_reason=d.get("end_reason"),
            end_related_task=d.get("end_related_task"),
            end_recover=d.get("end_recover"),
            master_port=d.get("master_port"),
            first_step=d.get("first_step"),
            last_step=d.get("last_step"),
            first_output_at=from_iso(d.get("first_output_at")),
            recover_records=[RecoverRecord.from_dict(r) for r in d.get("recover_records", [])],
        )


_RECOVER_TIMES = (
    "recover_end_at",
    "fault_at",
    "detected_at",
    "decided_at",
    "workers_stopped_at",
    "workers_started_at",
    "first_progress_at",
)


def _required_time(s: str) -> datetime:
    t = from_iso(s)
    if t is None:
        raise ValueError("a required time is missing")
    return t


_STEP_REEXECUTION = "step_reexecution"  # policy.decision.Rung's first (records imports no policy)

# how the CLI words each rung's recoveries, finest rung first (the ladder's order)
RUNG_NOUNS = {_STEP_REEXECUTION: "step re-execution", "in_process_restart": "in-process restart",
              "process_restart": "process restart", "pod_reschedule": "pod reschedule",
              "job_reschedule_with_taint": "job reschedule"}


def recoveries_text(by_rung: dict[str, int]) -> str:
    """`2 recoveries (1 step re-execution, 1 process restart)`, `0 recoveries`: what
    `recoveries_by_rung` counts, worded by rung (a step re-execution restarts no process)."""
    total = sum(by_rung.values())
    rungs = [*RUNG_NOUNS, *sorted(set(by_rung) - set(RUNG_NOUNS))]
    parts = ", ".join(plural(by_rung[r], RUNG_NOUNS.get(r, r)) for r in rungs if by_rung.get(r))
    head = "1 recovery" if total == 1 else f"{total} recoveries"
    return f"{head} ({parts})" if parts else head


def incidents_of(records: list[RunningRecord]) -> list[RecoverRecord]:
    """One recover record per fault: a record whose rung handed the fault to the next one
    (`downgrade`, or a rung out of budget, `quotaExceeded`, whose fault the next record of
    the same detection goes on with) is not a fault of its own. The incidents `recovery`,
    the UI and the MTBF count."""
    out = []
    for r in records:
        rrs = r.recover_records
        for i, rr in enumerate(rrs):
            nxt = rrs[i + 1] if i + 1 < len(rrs) else None
            handed = rr.recover_result == RecoverResult.DOWNGRADE or (
                nxt is not None and nxt.detected_at == rr.detected_at
                and nxt.fault_at == rr.fault_at)
            if not handed:
                out.append(rr)
    return out


def recoveries_by_rung(records: list[RunningRecord]) -> dict[str, int]:
    """Recoveries that acted (succeeded, or still recovering with its workers started), by
    rung of the ladder: the one count of recoveries that `status`, `recovery`, `report` and
    the metrics all show (an incident no rung acted on, NO_RECOVERY, is none: a hang left
    running that ended by itself; a reschedule waiting for nodes has not acted yet, and may
    never: counted while it waited, a stop or the queue timeout took it back, and the count
    went down (walk-through 26)). One that acted stays counted whatever came of it: a
    restart whose workers started and failed again read 2 recoveries, then 0 (walk-through
    28); so does a step re-execution whose ranks re-formed their group and failed again
    (`workers_started_at`: when the ranks were told to go on; a record from before that was
    set reads `failed` only after it acted; walk-through 34 #5)."""
    counts: dict[str, int] = {}
    for r in records:
        for rr in r.recover_records:
            if rr.recover != NO_RECOVERY and (
                    rr.recover_result == RecoverResult.SUCCESS or rr.workers_started_at
                    is not None or (rr.recover == _STEP_REEXECUTION
                                    and rr.recover_result == RecoverResult.FAILED)):
                counts[rr.recover] = counts.get(rr.recover, 0) + 1
    return counts
