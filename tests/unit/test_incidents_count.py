"""One incident per fault (records.incidents_of): a rung that handed its fault to the next
one, by `downgrade` or by running out of budget (`quotaExceeded`) with the next record of the
same detection acting, is no incident of its own; a rung out of budget that ended the job is
(walk-through 23: two node losses read '3 incidents')."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from trainguard.records import (
    FaultScenario,
    RecoverRecord,
    RecoverResult,
    RunningRecord,
    StartType,
    incidents_of,
)

T0 = datetime(2026, 12, 5, tzinfo=timezone.utc)


def rr(rung: str, result: RecoverResult, at: datetime) -> RecoverRecord:
    return RecoverRecord(attempt=0, recover_start_at=at, fault_scenario=FaultScenario.NODE_FAULT,
                         reason="node lost", related_task="node/node-0", recover=rung,
                         recover_result=result, fault_at=at, detected_at=at)


def test_a_rung_out_of_budget_that_handed_the_fault_on_is_no_incident() -> None:
    first, second = T0, T0 + timedelta(minutes=1)
    records = [RunningRecord(0, T0, StartType.FIRST_START, recover_records=[
        rr("pod_reschedule", RecoverResult.SUCCESS, first),
        rr("pod_reschedule", RecoverResult.QUOTA_EXCEEDED, second),
        rr("job_reschedule", RecoverResult.SUCCESS, second)])]
    assert [i.recover for i in incidents_of(records)] == ["pod_reschedule", "job_reschedule"]


def test_a_rung_out_of_budget_that_ended_the_job_is_an_incident() -> None:
    records = [RunningRecord(0, T0, StartType.FIRST_START, recover_records=[
        rr("in_process_restart", RecoverResult.DOWNGRADE, T0),
        rr("process_restart", RecoverResult.QUOTA_EXCEEDED, T0)])]
    assert [i.recover for i in incidents_of(records)] == ["process_restart"]
