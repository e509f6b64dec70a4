"""A launcher killed in a restart's backoff left its incident `recovering` for good: the
relaunch closed the attempt (lost) but not the incident, so the report showed a succeeded job
still recovering and the ledger booked the 10 minutes to the relaunch as recovery, not queued
(walk-through 30, #12)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

from trainguard.controller.incidents import IncidentBook
from trainguard.controller.store import JobStore
from trainguard.records import (
    FaultScenario,
    RecoverRecord,
    RecoverResult,
    RunningRecord,
    StartType,
    recoveries_by_rung,
)

T0 = datetime(2026, 12, 5, 19, 52, tzinfo=timezone.utc)


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def test_a_relaunch_ends_the_incident_the_lost_launch_was_recovering_from(
        tmp_path: Path) -> None:
    rec = RunningRecord(0, at(0), StartType.FIRST_START)
    rec.recover_records.append(RecoverRecord(
        attempt=0, recover_start_at=at(12), fault_scenario=FaultScenario.JOB_FAILED,
        reason="rank 1 was killed by SIGKILL", related_task="worker-1",
        recover="process_restart", decided_at=at(12.1)))  # then its 30 s backoff
    with JobStore.create(tmp_path / "job", "r") as store:
        store.put_running(rec)
        IncidentBook(store).launch_lost(at(20))  # its last sign of life, in the backoff
        (after,) = store.running_records()
    (rr,) = after.recover_records
    assert (rr.recover_result, rr.recover_end_at) == (RecoverResult.TERMINATED, at(20))
    assert after.end_at == at(20) and recoveries_by_rung([after]) == {}  # it never restarted
