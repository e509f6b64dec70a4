"""`trainguard report`'s incidents each carry their own diagnosis or hang, not their attempt's
last one (walk-through 37 #1: with the in-process rungs one attempt holds many incidents)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

from trainguard.goodput.report import own_events
from trainguard.records import (
    Event,
    FaultScenario,
    Involved,
    Level,
    Reason,
    RecoverRecord,
)

T0 = datetime(2026, 12, 6, 19, 12, tzinfo=timezone.utc)


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def incident(scenario: FaultScenario, fault_s: float, decided_s: float) -> RecoverRecord:
    return RecoverRecord(attempt=0, recover_start_at=at(decided_s), fault_scenario=scenario,
                         reason="x", related_task="worker-1", fault_at=at(fault_s),
                         detected_at=at(fault_s + 0.1), decided_at=at(decided_s))


def event(reason: Reason, s: float, what: str) -> Event:
    return Event(at(s), Level.WARNING, reason.value, what, Involved("r", attempt=0),
                 {"what": what})


def test_each_incident_of_one_attempt_gets_the_event_of_its_own_fault() -> None:
    step = incident(FaultScenario.ERROR_IN_LOG, 5.0, 5.1)  # a step re-executed: no event
    kill = incident(FaultScenario.JOB_FAILED, 10.0, 10.2)  # a SIGKILL, restarted in place
    hang = incident(FaultScenario.JOB_HANGED, 20.0, 30.0)  # then a hang, confirmed at 29.9
    later = incident(FaultScenario.JOB_FAILED, 40.0, 40.3)  # one with no event
    every = [step, kill, hang, later]
    hung = [r.fault_scenario == FaultScenario.JOB_HANGED for r in every]
    diagnoses = [event(Reason.FAILURE_DIAGNOSED, 10.15, "killed")]
    hangs = [event(Reason.HANG_CONFIRMED, 29.9, "sleeping")]
    assert own_events(every, diagnoses, [not h for h in hung]) == [{}, {"what": "killed"}, {},
                                                                   {}]
    assert own_events(every, hangs, hung) == [{}, {}, {"what": "sleeping"}, {}]


def test_two_crashes_within_a_second_each_get_their_own_diagnosis() -> None:
    """Review 43 #2: the last event within a second of the decision won: the first of two
    crashes 0.5 s apart got the second's diagnosis. A hang's event written after its stacks
    were taken, past the decision, is still its own (review 43 #7)."""
    first = incident(FaultScenario.JOB_FAILED, 10.0, 10.1)
    second = incident(FaultScenario.JOB_FAILED, 10.5, 10.6)
    hang = incident(FaultScenario.JOB_HANGED, 20.0, 28.0)
    diagnoses = [event(Reason.FAILURE_DIAGNOSED, 10.05, "one"),
                 event(Reason.FAILURE_DIAGNOSED, 10.55, "two")]
    assert own_events([first, second], diagnoses, [True, True]) == [{"what": "one"},
                                                                    {"what": "two"}]
    late = [event(Reason.HANG_CONFIRMED, 30.5, "late")]
    assert own_events([hang], late, [True]) == [{"what": "late"}]


def test_a_recovery_that_failed_or_was_stopped_reads_not_recovered(tmp_path: Path) -> None:
    """Walk-through 42 #13: a node lost, the job stopped while it queued for a node:
    `recovered in - (detect 3.192s, stop 3.250s, start -, resume -)`."""
    from trainguard.controller.store import JobStore
    from trainguard.goodput.report import gather, render, report_doc
    from trainguard.records import RecoverResult, RunningRecord, StartType, iso

    rec = RunningRecord(0, at(0), StartType.FIRST_START, at(20), "stopped", "SIGTERM")
    inc = incident(FaultScenario.NODE_FAULT, 10.0, 13.2)
    inc.recover, inc.recover_result = "pod_reschedule", RecoverResult.TERMINATED
    inc.last_step_before, inc.recover_end_at = 65, at(20)
    rec.recover_records.append(inc)
    with JobStore.create(tmp_path / "job", "r") as store:
        store.put_running(rec)
        store.set_meta(state="stopped", attempt=0, created_at=iso(at(0)), ended_at=iso(at(20)))
        text = render(report_doc(gather(store, at(20))))
    assert "not recovered (terminated): detected in 0.100s, stopped in -; steps lost -" in text
    assert "recovered in" not in text, text
