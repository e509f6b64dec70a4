"""Running records (one per attempt) and recover records (one per incident), kept current.

The controller tells the book what happened; the book fills in the platform's record
shapes, the time split and the steps lost, and writes them to the store as they change.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from trainguard.controller.store import JobStore
from trainguard.diagnosis.taxonomy import Diagnosis
from trainguard.policy.process import Action, Decision
from trainguard.protocol import Progress
from trainguard.records import (
    FaultScenario,
    RecoverRecord,
    RecoverResult,
    RunningRecord,
    StartType,
    utcnow,
)

_CHIP_CATEGORIES = {"gpu_hardware", "npu_hardware_or_driver"}


def fault_scenario(diag: Diagnosis) -> FaultScenario:
    if diag.category.value in _CHIP_CATEGORIES:
        return FaultScenario.CHIP_FAULT
    if diag.isolate_node:
        return FaultScenario.NODE_FAULT
    if diag.from_log:
        return FaultScenario.ERROR_IN_LOG
    return FaultScenario.JOB_FAILED


class IncidentBook:
    def __init__(self, store: JobStore) -> None:
        self._store = store
        self.current: RunningRecord | None = None
        self._pending: tuple[RunningRecord, RecoverRecord] | None = None
        self._max_step: int | None = None

    def _save(self, rec: RunningRecord | None) -> None:
        if rec is not None:
            self._store.put_running(rec)

    def attempt_started(self, attempt: int, start_type: StartType, port: int) -> None:
        self.current = RunningRecord(attempt, utcnow(), start_type, master_port=port)
        self._save(self.current)

    def workers_started(self, at: datetime) -> None:
        if self._pending is not None:
            owner, inc = self._pending
            inc.workers_started_at = at
            self._save(owner)

    def resumed(self, step: int) -> None:
        """The library loaded the checkpoint of `step`: the authoritative resume point."""
        if self._pending is not None:
            owner, inc = self._pending
            inc.resumed_step = step
            if inc.last_step_before is not None:
                inc.steps_lost = max(0, inc.last_step_before - step)
            self._save(owner)

    def progress_seen(self, p: Progress, persist: bool = True) -> None:
        """Steps of the current attempt; ends the open incident at the first one."""
        rec = self.current
        if rec is None:
            return
        changed = rec.first_step != p.first_step or rec.last_step != p.last_step
        rec.first_step, rec.last_step = p.first_step, p.last_step
        if self._pending is not None and p.first_step is not None and p.first_step_at:
            owner, inc = self._pending
            inc.first_progress_at = inc.recover_end_at = p.first_step_at
            if inc.resumed_step is None:  # no Resumed report: first step after restart - 1
                inc.resumed_step = p.first_step - 1
            if inc.last_step_before is not None:
                inc.steps_lost = max(0, inc.last_step_before - inc.resumed_step)
            inc.recover_result = RecoverResult.SUCCESS
            self._pending = None
            self._save(owner)
        if changed and persist:
            self._save(rec)

    def attempt_failed(self, attempt: int, diag: Diagnosis, decision: Decision,
                       fault_at: datetime, detected: datetime, stopped: datetime,
                       progress: Progress) -> None:
        restart = decision.action == Action.RESTART
        self._incident(
            attempt, progress, stopped, f"{diag.category.value}: {diag.summary}", restart,
            detected=detected, fault_scenario=fault_scenario(diag), reason=diag.summary,
            related_task=_task(diag.culprit_rank), recover_result=decision.result,
            fault_at=fault_at, backoff_s=decision.delay_s if restart else None,
            category=diag.category.value)

    def attempt_hanged(self, attempt: int, reason: str, culprit_rank: int | None,
                       fault_at: datetime | None, detected: datetime, stopped: datetime,
                       progress: Progress, restart: bool) -> None:
        """A confirmed hang ended `attempt` (the ranks were stopped); restarted in place or not.

        fault_at is the last progress before the hang, so detect = the detection latency.
        """
        self._incident(
            attempt, progress, stopped, f"hang: {reason}", restart, detected=detected,
            fault_scenario=FaultScenario.JOB_HANGED, reason=reason,
            related_task=_task(culprit_rank),
            recover_result=RecoverResult.RECOVERING if restart
            else RecoverResult.QUOTA_EXCEEDED,
            fault_at=fault_at or detected, backoff_s=0.0 if restart else None,
            category="nccl_timeout_or_hang")

    def attempt_node_fault(self, attempt: int, *, node: str, reason: str, recover: str,
                           result: RecoverResult, tried: list[tuple[str, RecoverResult, str]],
                           fault_at: datetime, detected: datetime, stopped: datetime,
                           progress: Progress, category: str | None = None,
                           scenario: FaultScenario = FaultScenario.NODE_FAULT) -> None:
        """A lost or faulty node ended `attempt`. Each rung of the ladder that could not act
        gets a closed record (downgrade / quotaExceeded); the last rung gets the last record,
        open while it recovers (result `recovering`), closed when it could not (`failed`)."""
        rec = self.current
        if rec is None:
            return
        for rung, res, why in tried:
            rec.recover_records.append(RecoverRecord(
                attempt=attempt, recover_start_at=detected, detected_at=detected,
                fault_scenario=scenario, reason=why,
                related_task=f"node/{node}", recover=rung, recover_result=res,
                recover_end_at=detected, fault_at=fault_at, workers_stopped_at=stopped,
                decided_at=utcnow(), category=category))
        restart = result == RecoverResult.RECOVERING
        self._incident(attempt, progress, stopped, f"node {node}: {reason}", restart,
                       detected=detected, fault_scenario=scenario,
                       reason=reason, related_task=f"node/{node}", recover_result=result,
                       fault_at=fault_at, backoff_s=0.0 if restart else None,
                       category=category, recover=recover)

    def _incident(self, attempt: int, progress: Progress, stopped: datetime, end_reason: str,
                  restart: bool, *, detected: datetime, **fields: Any) -> None:
        """Close the attempt's running record with a new recover record (`fields`); with a
        restart the incident stays open until the next attempt makes progress."""
        rec = self.current
        if rec is None:
            return
        self.progress_seen(progress)
        self._close_pending(RecoverResult.FAILED, detected)
        if progress.last_step is not None:
            self._max_step = max(progress.last_step, self._max_step or progress.last_step)
        now = utcnow()
        recover = fields.pop("recover", "process_restart" if restart else "none")
        inc = RecoverRecord(
            attempt=attempt, recover_start_at=detected, detected_at=detected,
            recover=recover,
            recover_end_at=None if restart else now, workers_stopped_at=stopped,
            decided_at=now, last_step_before=progress.last_step
            if progress.last_step is not None else self._max_step, **fields)
        rec.recover_records.append(inc)
        rec.end_at, rec.end_reason = stopped, end_reason
        rec.end_related_task = inc.related_task
        rec.end_recover = inc.recover
        self._pending = (rec, inc) if restart else None
        self._save(rec)

    def backoff_interrupted(self) -> None:
        """Stopped while waiting to restart: nothing runs; the open incident is terminated."""
        self._close_pending(RecoverResult.TERMINATED, utcnow())

    def attempt_not_started(self, attempt: int, reason: str) -> None:
        """The workers of `attempt` could not be started."""
        rec = self.current
        if rec is not None and rec.attempt == attempt and rec.end_at is None:
            rec.end_at, rec.end_reason = utcnow(), reason
            self._save(rec)
        self._close_pending(RecoverResult.FAILED, utcnow())

    def attempt_succeeded(self, attempt: int, progress: Progress) -> None:
        self._end(progress, "succeeded", RecoverResult.SUCCESS)

    def attempt_stopped(self, attempt: int, reason: str, progress: Progress) -> None:
        self._end(progress, reason, RecoverResult.TERMINATED)

    def _end(self, progress: Progress, reason: str, pending_result: RecoverResult) -> None:
        if self.current is None:
            return
        self.progress_seen(progress)
        self._close_pending(pending_result, utcnow())
        self.current.end_at, self.current.end_reason = utcnow(), reason
        self._save(self.current)

    def _close_pending(self, result: RecoverResult, at: datetime) -> None:
        if self._pending is None:
            return
        owner, inc = self._pending
        inc.recover_result, inc.recover_end_at = result, at
        self._pending = None
        self._save(owner)


def _task(rank: int | None) -> str:
    return "job" if rank is None else f"worker-{rank}"
