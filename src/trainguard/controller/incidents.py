"""Running records (one per attempt) and recover records (one per incident), kept current.

The controller tells the book what happened; the book fills in the platform's record
shapes, the time split and the steps lost, and writes them to the store as they change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import Any, NamedTuple

from trainguard.controller.faults import LOST_END_REASON, Fault
from trainguard.controller.store import JobStore
from trainguard.errors import StoreError
from trainguard.policy.decision import Action, Decision, Rung
from trainguard.protocol import Progress
from trainguard.records import (
    NO_RECOVERY,
    RecoverRecord,
    RecoverResult,
    RunningRecord,
    StartType,
    utcnow,
)
from trainguard.states import JobState


class _Open(NamedTuple):
    """An incident's record and the attempt's record that holds it."""
    owner: RunningRecord
    inc: RecoverRecord
    after: datetime | None  # the first step time the fault's report had (agents' clocks)
    number: int = 0  # which incident of this controller's (IncidentBook.recovering)


class IncidentBook:
    def __init__(self, store: JobStore,
                 on_error: Callable[[Exception], None] | None = None) -> None:
        self._store = store
        self._on_error = on_error  # a write that failed (the job goes on; it is retried)
        self._unsaved: dict[int, RunningRecord] = {}  # attempt -> record not written yet
        self.current: RunningRecord | None = None
        self._pending: _Open | None = None  # the incident recovering now
        self._opened = 0  # incidents opened so far
        self._recovered: _Open | None = None  # the last one that recovered
        self._max_step: int | None = None
        self._step_open: RecoverRecord | None = None  # rung 0's record while it recovers
        self._step_handed: RecoverRecord | None = None  # rung 0 gave its step's fault up
        self._hang_open: RecoverRecord | None = None  # a confirmed hang left running
        self._first_resume = True  # this launch's first resume not seen yet

    def _save(self, rec: RunningRecord | None) -> None:
        """Write the record (recover records included); one the store cannot take now (a
        full disk) is kept and written again by `flush`: the job goes on."""
        if rec is not None:
            self._unsaved[rec.attempt] = rec
            self.flush()

    def flush(self) -> None:
        """Write the records that wait (each is the current state: a later write of the
        same attempt replaces it)."""
        for attempt, rec in sorted(self._unsaved.items()):
            try:
                self._store.put_running(rec)
            except (StoreError, OSError) as e:
                if self._on_error is None:
                    raise
                self._on_error(e)
                return
            del self._unsaved[attempt]

    def attempt_started(self, attempt: int, start_type: StartType, port: int) -> None:
        self.current = RunningRecord(attempt, utcnow(), start_type, master_port=port)
        self._save(self.current)

    def workers_started(self, at: datetime, standby: list[bool]) -> None:
        """The restarted workers are up; `standby`: per started worker, whether it came
        from a pre-warmed standby."""
        if self._pending is not None:
            owner, inc, *_ = self._pending
            inc.workers_started_at = at
            inc.workers_from = workers_from(standby)
            self._save(owner)

    def started_from(self, standby: list[bool]) -> None:
        """An in-process restart's processes are all in (its start time is the decision's):
        whether those it started came from standbys (the open or just-closed record)."""
        held = self._pending if self._pending is not None else self._recovered
        if held is not None:
            owner, inc, *_ = held
            inc.workers_from = workers_from(standby)
            self._save(owner)

    def recovering(self) -> int | None:
        """Which incident a resume now belongs to (the one recovering, or the last one that
        recovered; None before any): one Resumed event is said per incident, not per
        attempt (walk-through 37 #2: a second in-process restart said none)."""
        held = self._pending if self._pending is not None else self._recovered
        return None if held is None else held.number

    def resumed(self, step: int, source: str) -> None:
        """The library loaded the checkpoint of `step` from `source` (memory, peer, storage,
        "+"-joined when the ranks loaded from several):
        the authoritative resume point."""
        if self._pending is None and self._recovered is not None:
            owner, inc, *_ = self._recovered  # a later rank's report, after the first step
            if inc.resumed_step == step:
                inc.resumed_from = source
                self._save(owner)
        if self._pending is not None:
            owner, inc, *_ = self._pending
            inc.resumed_step, inc.resumed_from = step, source
            if inc.last_step_before is not None:
                inc.steps_lost = max(0, inc.last_step_before - step)
            self._save(owner)
        elif self._first_resume and self._recovered is None:
            self._ended_unresumed(step)
        self._first_resume = False

    def _ended_unresumed(self, step: int) -> None:
        """A relaunch's first resume: the launch before ended in an incident that never
        resumed (stopped or failed while it recovered); what it lost is known now (walk-
        through 42 #2: `steps lost -` beside `done again 5`)."""
        earlier = [r for r in self._store.running_records()
                   if self.current is None or r.attempt < self.current.attempt]
        incs = earlier[-1].recover_records if earlier else []
        inc = incs[-1] if incs else None
        if inc is not None and inc.steps_lost is None and inc.resumed_step is None \
                and inc.last_step_before is not None:
            inc.steps_lost = max(0, inc.last_step_before - step)
            self._save(earlier[-1])

    def output_seen(self, at: datetime) -> None:
        """A rank of the current attempt wrote a line: the first one is the attempt's first
        sign of life (what bounds a restart's downtime for a script that reports no steps)."""
        rec = self.current
        if rec is not None and rec.first_output_at is None and at >= rec.start_at:
            rec.first_output_at = at
            self._save(rec)

    def progress_seen(self, p: Progress, persist: bool = True) -> None:
        """Steps of the current attempt; ends the open incident at the first one."""
        rec = self.current
        if rec is None:
            return
        first = rec.first_step if rec.first_step is not None else p.first_step  # the attempt's
        handed = self._step_handed
        if handed is not None and p.last_step is not None and handed.last_step_before \
                is not None and p.last_step > handed.last_step_before + 1:
            self._step_handed = None  # trained past the step given up: no failure followed
        changed = rec.first_step != first or rec.last_step != p.last_step
        rec.first_step, rec.last_step = first, p.last_step
        # the failed attempt's own first step is not the recovery's (a second node lost
        # before the rescheduled attempt started: the first record read `success`, ended
        # 8.7 s before it began, with steps lost from no resume; walk-through 26). Compared
        # with the first step the fault's report had, on the agents' clocks, not ours
        if self._pending is not None and p.first_step is not None and p.first_step_at and (
                self._pending.after is None or p.first_step_at > self._pending.after):
            owner, inc, *_ = self._pending
            inc.first_progress_at = inc.recover_end_at = p.first_step_at
            every = p.first_step == (inc.resumed_step or 0) + 1  # (no resume: from step 0)
            if inc.resumed_step is None:  # no Resumed report: first step after restart - 1
                inc.resumed_step = p.first_step - 1
            if inc.last_step_before is not None:
                inc.steps_lost = max(0, inc.last_step_before - inc.resumed_step)
            elif every:  # a job that reports every step (its first after the resume) whose
                # failed attempt reported none did none (walk-through 40 #9: `-`); one that
                # reports every Nth step may have done N - 1 (review 49 #6): unknown
                inc.steps_lost = 0
            inc.recover_result = RecoverResult.SUCCESS
            self._recovered, self._pending = self._pending, None
            self._save(owner)
        if changed and persist:
            self._save(rec)

    def record(self, attempt: int, decision: Decision, fault: Fault) -> None:
        """One incident ended `attempt` (or, restarted in-process, goes on in it): each rung
        of the ladder that could not act gets a closed record (downgrade / quotaExceeded);
        the rung that acts gets the last record, open while it recovers (`recovering`),
        closed when the job gives up."""
        rec = self.current
        if rec is None:
            return
        handed, self._step_handed = self._step_handed, None
        if handed is not None and handed.detected_at is not None and handed.fault_at:
            # the failure rung 0 handed on (its ranks raised the step's error): the same
            # fault, detected when the step failed (walk-through 27: counted twice, and
            # its recovery timed from the ranks' exit)
            fault = replace(fault, fault_at=handed.fault_at, detected=handed.detected_at)
        tried = list(decision.tried)
        recover = decision.rung.value if decision.rung is not None else NO_RECOVERY
        result = decision.result
        if decision.action == Action.GIVE_UP and decision.rung is None and tried:
            last = tried.pop()  # out of every budget: the last rung tried is the last record
            recover, result = last.rung.value, last.result
        for t in tried:
            rec.recover_records.append(RecoverRecord(
                attempt=attempt, recover_start_at=fault.detected, detected_at=fault.detected,
                fault_scenario=fault.scenario, reason=t.why, related_task=fault.related_task,
                recover=t.rung.value, recover_result=t.result, recover_end_at=fault.detected,
                fault_at=fault.fault_at, workers_stopped_at=fault.stopped, decided_at=utcnow(),
                category=fault.category))
        restart = decision.action != Action.GIVE_UP
        self._incident(attempt, fault.progress, fault.stopped, fault.end_reason, restart,
                       detected=fault.detected, fault_scenario=fault.scenario,
                       reason=fault.reason, related_task=fault.related_task,
                       recover_result=result, fault_at=fault.fault_at,
                       backoff_s=decision.delay_s if restart else None,
                       category=fault.category, recover=recover,
                       ends_attempt=decision.action != Action.RESTART_RANKS)

    def hang_left_running(self, attempt: int, fault: Fault) -> None:
        """A confirmed hang no rung acts on (`--restart-on-hang` off): an incident of the
        running attempt, not recovered (`failed`) and open while the ranks are left hung;
        it ends when progress comes back (`success`, by itself), or with the attempt
        (stopped: `terminated`; a rank failed: `failed`)."""
        rec = self.current
        if rec is None:
            return
        self._close_hang(RecoverResult.FAILED, fault.detected)
        self._hang_open = RecoverRecord(
            attempt=attempt, recover_start_at=fault.detected, detected_at=fault.detected,
            fault_scenario=fault.scenario, reason=fault.reason, related_task=fault.related_task,
            recover=NO_RECOVERY, recover_result=RecoverResult.FAILED, fault_at=fault.fault_at,
            decided_at=fault.detected, last_step_before=fault.progress.last_step,
            category=fault.category)
        rec.recover_records.append(self._hang_open)
        self._save(rec)

    def hang_cleared(self, at: datetime) -> None:
        """The workers make progress again: a hang left running ended by itself."""
        if self._hang_open is not None:
            self._hang_open.first_progress_at = at
        self._close_hang(RecoverResult.SUCCESS, at)

    def _close_hang(self, result: RecoverResult, at: datetime) -> None:
        inc, self._hang_open = self._hang_open, None
        if inc is not None and self.current is not None:
            inc.recover_result, inc.recover_end_at = result, at
            self._save(self.current)

    def step_incident(self, attempt: int, decision: Decision, fault: Fault, step: int) -> None:
        """Rung 0 acted (or could not): a record in the running attempt, which goes on. A
        retry of the same step that failed again closes the open one as failed."""
        rec = self.current
        if rec is None:
            return
        now = utcnow()
        self._close_step(fault.detected)
        acting = decision.action == Action.REEXECUTE
        inc = RecoverRecord(
            attempt=attempt, recover_start_at=fault.detected, detected_at=fault.detected,
            fault_scenario=fault.scenario, reason=fault.reason, related_task=fault.related_task,
            recover=Rung.STEP_REEXECUTION.value,
            recover_result=RecoverResult.RECOVERING if acting else decision.result,
            recover_end_at=None if acting else now, fault_at=fault.fault_at,
            decided_at=now, backoff_s=0.0, last_step_before=step - 1, resumed_step=step - 1,
            steps_lost=0, category=fault.category)
        if acting:  # the ranks got REFORM_GO and go on: it acted, and counts as a recovery
            inc.workers_started_at = now  # whatever comes of it (walk-through 34 #5)
        rec.recover_records.append(inc)
        self._step_open = inc if acting else None
        self._step_handed = None if acting else inc  # the next rung's record goes on with it
        self._save(rec)

    def _close_step(self, at: datetime) -> None:
        """The attempt ended while a re-executed step had not succeeded: that retry failed."""
        if self._step_open is not None:
            self._step_open.recover_result = RecoverResult.FAILED
            self._step_open.recover_end_at = at
            self._step_open = None

    def step_reexecuted(self, at: datetime) -> None:
        """The re-executed step succeeded on every rank: its record ends in success."""
        if self._step_open is None or self.current is None:
            return
        inc, self._step_open = self._step_open, None
        inc.recover_result, inc.recover_end_at, inc.first_progress_at = (
            RecoverResult.SUCCESS, at, at)
        self._save(self.current)

    def _incident(self, attempt: int, progress: Progress, stopped: datetime, end_reason: str,
                  restart: bool, *, detected: datetime, ends_attempt: bool = True,
                  **fields: Any) -> None:
        """Close the attempt's running record with a new recover record (`fields`); with a
        restart the incident stays open until the next attempt makes progress (an
        in-process restart: the attempt goes on, until it makes progress again)."""
        rec = self.current
        if rec is None:
            return
        self.progress_seen(progress)
        self._close_pending(RecoverResult.FAILED, detected)
        self._close_step(detected)
        self._close_hang(RecoverResult.FAILED, detected)
        if progress.last_step is not None:
            self._max_step = max(progress.last_step, self._max_step or progress.last_step)
        now = utcnow()
        recover = fields.pop("recover")
        inc = RecoverRecord(
            attempt=attempt, recover_start_at=detected, detected_at=detected,
            recover=recover,
            recover_end_at=None if restart else now, workers_stopped_at=stopped,
            decided_at=now, last_step_before=progress.last_step
            if progress.last_step is not None else self._max_step, **fields)
        rec.recover_records.append(inc)
        if not ends_attempt:  # in-process: the replacement started just now
            inc.workers_started_at = now
        else:
            rec.end_at, rec.end_reason = stopped, end_reason
            rec.end_related_task = inc.related_task
            rec.end_recover = inc.recover
        self._opened += 1
        self._pending = _Open(rec, inc, progress.first_step_at, self._opened) if restart else None
        self._save(rec)

    def recovery_failed(self, fault: Fault, result: RecoverResult = RecoverResult.FAILED
                        ) -> None:
        """The open incident's rung could not act after all (a reschedule's queue for nodes
        timed out): it ends `result` now, with the attempt, and says why (`terminated`:
        the job was stopped while the rung waited)."""
        if self._pending is None:
            return
        owner, inc, *_ = self._pending
        inc.reason, owner.end_reason = fault.reason, fault.end_reason
        self._close_pending(result, utcnow())

    def stopped_idle(self) -> None:
        """Stopped while no worker ran (waiting to restart, for nodes, for a rendezvous): the
        open incident is terminated."""
        self._close_pending(RecoverResult.TERMINATED, utcnow())

    def attempt_not_started(self, attempt: int, reason: str) -> None:
        """The workers of `attempt` could not be started."""
        rec = self.current
        if rec is not None and rec.attempt == attempt and rec.end_at is None:
            rec.end_at, rec.end_reason = utcnow(), reason
            self._save(rec)
        self._close_pending(RecoverResult.FAILED, utcnow())

    def launch_lost(self, at: datetime, last_step: int | None = None) -> None:
        """A relaunch found the previous launch `lost` (its launcher died: nothing recorded
        its end): the attempt it left open ends `lost` at its last sign of life, `at`, with
        its last step (`last_step`: the store's, or its rank logs' newer one: lost_launch.py),
        and so does an incident it was recovering from (terminated: a launcher killed in a
        restart's backoff left it `recovering` for good, and the gap to the relaunch read as
        recovery, not queued; walk-through 30)."""
        for rec in self._store.running_records():
            if rec.end_at is None:
                rec.end_at, rec.end_reason = max(at, rec.start_at), LOST_END_REASON
                for rr in rec.recover_records:
                    if rr.recover_result == RecoverResult.RECOVERING:
                        rr.recover_result = RecoverResult.TERMINATED
                        rr.recover_end_at = max(at, rr.recover_start_at)
                if last_step is not None and (rec.last_step is None or last_step > rec.last_step):
                    rec.last_step = last_step
                self._save(rec)

    def attempt_succeeded(self, attempt: int, progress: Progress) -> None:
        self._end(progress, JobState.SUCCEEDED.value, RecoverResult.SUCCESS)

    def attempt_stopped(self, attempt: int, reason: str, progress: Progress) -> None:
        self._end(progress, reason, RecoverResult.TERMINATED)

    def _end(self, progress: Progress, reason: str, pending_result: RecoverResult) -> None:
        if self.current is None:
            return
        self.progress_seen(progress)
        self._close_pending(pending_result, utcnow())
        self._close_step(utcnow())
        self._close_hang(pending_result, utcnow())
        self.current.end_at, self.current.end_reason = utcnow(), reason
        self._save(self.current)

    def _close_pending(self, result: RecoverResult, at: datetime) -> None:
        if self._pending is None:
            return
        owner, inc, *_ = self._pending
        inc.recover_result, inc.recover_end_at = result, at
        first = self.current.first_output_at if self.current is not None else None
        if result == RecoverResult.SUCCESS and inc.first_progress_at is None and first and \
                inc.workers_started_at is not None and first >= inc.workers_started_at:
            # a script that reports no steps: its recovery runs to the attempt's first output
            # line, as the goodput ledger's (walk-through 36 #2: resume and total read `-`)
            inc.first_progress_at = first
        self._pending = None
        self._save(owner)


def workers_from(standby: list[bool]) -> str | None:
    if not standby:
        return None
    return "standby" if all(standby) else "cold" if not any(standby) else "mixed"
