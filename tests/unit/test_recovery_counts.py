"""What the metrics and `status` count of recoveries and incidents (walk-through 34):
trainguard_incidents_total and the recovery-duration histogram counted recover records, not
incidents (a downgraded incident twice, its detect and decide twice: 5 where `recovery`, the
report and the UI said 4) (#4); a step re-execution whose ranks re-formed their group and
failed again was no recovery at all (`status` said `1 recovery (1 in-process restart)`
beside `step_retries 1/10`, and trainguard_restarts_total{rung="step_reexecution"} 0) (#5)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

from tests.unit.helpers import metric_samples as metrics
from trainguard.controller.faults import Fault
from trainguard.controller.incidents import IncidentBook
from trainguard.controller.store import JobStore
from trainguard.policy.decision import Action, Decision, History, Rung, Tried
from trainguard.protocol import Progress
from trainguard.records import (
    FaultScenario,
    RecoverRecord,
    RecoverResult,
    RunningRecord,
    StartType,
    recoveries_by_rung,
    recoveries_text,
    utcnow,
)

T0 = datetime(2026, 12, 6, tzinfo=timezone.utc)


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def record(rung: str, result: RecoverResult, fault: float, detected: float,
           decided: float, first_step: float | None) -> RecoverRecord:
    return RecoverRecord(
        attempt=0, recover_start_at=at(detected), fault_scenario=FaultScenario.JOB_FAILED,
        reason="rank 1 was killed by SIGKILL", related_task="worker-1", recover=rung,
        recover_result=result, fault_at=at(fault), detected_at=at(detected),
        workers_stopped_at=at(detected), decided_at=at(decided),
        workers_started_at=at(decided) if first_step is not None else None,
        first_progress_at=None if first_step is None else at(first_step))


def test_a_downgraded_incident_is_one_incident_in_the_metrics(tmp_path: Path) -> None:
    """killall: an in-process restart that recovered, then the same death with no new
    progress (the in-process rung downgraded, the process restart took it): 2 incidents,
    as `recovery` says; the metrics said 3, and timed the second one's detect twice."""
    job = tmp_path / "job"
    rec = RunningRecord(0, at(0), StartType.FIRST_START, recover_records=[
        record("in_process_restart", RecoverResult.SUCCESS, 10, 10.005, 10.01, 12.6),
        record("in_process_restart", RecoverResult.DOWNGRADE, 20, 20.002, 20.083, None),
        record("process_restart", RecoverResult.SUCCESS, 20, 20.002, 20.083, 27.2)])
    with JobStore.create(job, "r") as s:
        s.set_meta(state="running")
        s.put_running(rec)
    m = metrics(job)
    assert m[("trainguard_incidents_total", (("fault_scenario", "job_failed"),))] == 2
    assert m[("trainguard_incident_results", (("fault_scenario", "job_failed"),
                                              ("result", "success")))] == 2
    assert ("trainguard_incident_results", (("fault_scenario", "job_failed"),
                                            ("result", "downgrade"))) not in m
    for phase in ("detect", "decide", "total"):
        assert m[("trainguard_recovery_duration_seconds_count", (("phase", phase),))] == 2
    assert abs(m[("trainguard_recovery_duration_seconds_sum", (("phase", "decide"),))]
               - (0.005 + 0.081)) < 1e-9
    assert m[("trainguard_restarts_total", (("rung", "in_process_restart"),))] == 1
    assert m[("trainguard_restarts_total", (("rung", "process_restart"),))] == 1


def _step_fault() -> Fault:
    t = utcnow()
    return Fault(FaultScenario.ERROR_IN_LOG, "step 6 failed: RuntimeError: Connection closed",
                 "step 6 failed", "worker-1", t, t, t, Progress(last_step=6), "nccl")


def test_a_step_reexecution_that_acted_and_failed_stays_a_recovery(tmp_path: Path) -> None:
    """coll3 (`collective:2@rank=1,step=6 --operator-reexecution`): the ranks re-formed
    their group and ran step 6 again, which failed again; the second failure found the
    step's budget spent and the in-process restart took it. Two recoveries: the step
    re-execution acted, whatever came of it."""
    job = tmp_path / "job"
    store = JobStore.create(job, "r")
    store.set_meta(state="running")
    book = IncidentBook(store)
    book.attempt_started(0, StartType.FIRST_START, 29500)
    reform = Decision(Action.REEXECUTE, "re-executing step 6 (1/1 for this step)",
                      History(step_retries=1), rung=Rung.STEP_REEXECUTION)
    book.step_incident(0, reform, _step_fault(), 6)
    assert book.current is not None
    assert recoveries_by_rung([book.current]) == {"step_reexecution": 1}  # at once
    why = "step 6 was re-executed 1 time(s) and failed again (--step-retries 1)"
    spent = Decision(Action.DOWNGRADE, why, History(step_retries=1),
                     result=RecoverResult.QUOTA_EXCEEDED,
                     tried=(Tried(Rung.STEP_REEXECUTION, RecoverResult.QUOTA_EXCEEDED, why),))
    book.step_incident(0, spent, _step_fault(), 6)
    first, second = book.current.recover_records
    assert first.recover_result == RecoverResult.FAILED and first.workers_started_at
    assert second.recover_result == RecoverResult.QUOTA_EXCEEDED  # did not act: not counted
    assert second.workers_started_at is None
    assert recoveries_by_rung([book.current]) == {"step_reexecution": 1}  # stays counted
    book.record(0, Decision(Action.RESTART_RANKS, "restart 1/3 after a broken process group",
                            History(restarts_used=1), rung=Rung.IN_PROCESS_RESTART,
                            ranks=(0, 1)), _step_fault())
    by_rung = recoveries_by_rung([book.current])
    assert by_rung == {"step_reexecution": 1, "in_process_restart": 1}
    assert recoveries_text(by_rung) == \
        "2 recoveries (1 step re-execution, 1 in-process restart)"
    m = metrics(job)
    assert m[("trainguard_restarts_total", (("rung", "step_reexecution"),))] == 1
    # two faults: the step's first failure and its failure again (handed to rung 1a)
    assert m[("trainguard_incidents_total", (("fault_scenario", "error_in_log"),))] == 2


def test_a_step_reexecution_recorded_failed_before_it_said_so_is_counted() -> None:
    """A store written before `workers_started_at` was set on a step re-execution: a record
    `failed` only ever closed one that re-formed the group (not acting: downgrade or
    quotaExceeded)."""
    old = RecoverRecord(attempt=0, recover_start_at=at(1), fault_scenario=FaultScenario
                        .ERROR_IN_LOG, reason="step 6 failed", related_task="worker-1",
                        recover="step_reexecution", recover_result=RecoverResult.FAILED)
    not_acting = RecoverRecord(attempt=0, recover_start_at=at(2), fault_scenario=FaultScenario
                               .ERROR_IN_LOG, reason="step 6 failed", related_task="worker-0",
                               recover="step_reexecution",
                               recover_result=RecoverResult.QUOTA_EXCEEDED)
    rec = RunningRecord(0, at(0), StartType.FIRST_START, recover_records=[old, not_acting])
    assert recoveries_by_rung([rec]) == {"step_reexecution": 1}
