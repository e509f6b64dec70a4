"""The job's Prometheus counters never go down, and agree with `status` (walk-through 30):
trainguard_restarts_total counted only success/recovering incidents (a restart whose workers
failed again dropped out: 1 -> 0 while status said 1 recovery); trainguard_recoveries_total
counted incidents by their current result, so each series went down as an incident moved
on; trainguard_nodes read 0 healthy nodes for every single-node job."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

from tests.unit.helpers import metric_samples as samples
from trainguard.controller.store import JobStore
from trainguard.records import (
    FaultScenario,
    RecoverRecord,
    RecoverResult,
    RunningRecord,
    StartType,
)

T0 = datetime(2026, 12, 5, tzinfo=timezone.utc)


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def restart(result: RecoverResult, started: bool) -> RecoverRecord:
    return RecoverRecord(
        attempt=0, recover_start_at=at(10), fault_scenario=FaultScenario.JOB_FAILED,
        reason="rank 1 killed", related_task="worker-1", recover="process_restart",
        decided_at=at(11), workers_started_at=at(12) if started else None,
        recover_result=result)


def test_the_counters_follow_the_incidents_without_going_down(tmp_path: Path) -> None:
    job = tmp_path / "job"
    rec = RunningRecord(0, at(0), StartType.FIRST_START)
    incident = restart(RecoverResult.RECOVERING, started=False)  # in its backoff
    rec.recover_records.append(incident)
    seen = []
    for result, started in ((RecoverResult.RECOVERING, False), (RecoverResult.RECOVERING, True),
                            (RecoverResult.FAILED, True)):  # its workers failed again
        incident.recover_result, incident.workers_started_at = result, \
            at(12) if started else None
        with JobStore.create(job, "r") as s:
            s.set_meta(state="running")
            s.put_running(rec)
        m = samples(job)
        seen.append((m[("trainguard_restarts_total", (("rung", "process_restart"),))],
                     m[("trainguard_incidents_total", (("fault_scenario", "job_failed"),))]))
        assert m[("trainguard_incident_results", (("fault_scenario", "job_failed"),
                                                  ("result", result.value)))] == 1
    # not counted while it waited; counted once its workers started, and stays counted
    assert seen == [(0, 1), (1, 1), (1, 1)]


def test_a_single_node_job_has_one_healthy_node(tmp_path: Path) -> None:
    job = tmp_path / "job"
    with JobStore.create(job, "r") as s:
        s.set_meta(state="running")
    assert samples(job)[("trainguard_nodes", (("state", "healthy"),))] == 1


def test_connections_the_hub_refused_are_counters_by_reason(tmp_path: Path) -> None:
    """(walk-through 32) The hub's refusals were told in its log only."""
    job = tmp_path / "job"
    with JobStore.create(job, "r") as s:
        s.set_meta(state="running")
        zero = samples(job)  # a job whose controller refused none (or has no hub): 0, not absent
        assert {k[1]: v for k, v in zero.items()
                if k[0] == "trainguard_connections_refused_total"} == {
            (("reason", r),): 0.0 for r in ("handshake", "over_budget", "forged_frame")}
        s.set_meta(connections_refused={"handshake": 3, "over_budget": 0, "forged_frame": 1})
        m = samples(job)
    assert m[("trainguard_connections_refused_total", (("reason", "handshake"),))] == 3
    assert m[("trainguard_connections_refused_total", (("reason", "forged_frame"),))] == 1


def test_worker_messages_the_agents_refused_are_a_counter(tmp_path: Path) -> None:
    """(security.md W3's leftover) The worker channels' refusals were in the agents' logs only."""
    job = tmp_path / "job"
    with JobStore.create(job, "r") as s:
        s.set_meta(state="running")
        assert samples(job)[("trainguard_worker_messages_refused_total", ())] == 0
        s.set_meta(worker_messages_refused=7)
        assert samples(job)[("trainguard_worker_messages_refused_total", ())] == 7


def test_diagnoses_count_the_confirmed_hangs_as_recovery_and_diagnose_name_them(
        tmp_path: Path) -> None:
    """Walk-through 40 #8: trainguard_diagnoses_total counted the FailureDiagnosed events
    only, so a dashboard built on it never showed the hangs `recovery` and `diagnose` name."""
    from trainguard.records import Event, Involved, Level, Reason

    job = tmp_path / "job"
    who = Involved(job="r", rank=1, attempt=0)
    with JobStore.create(job, "r") as s:
        s.set_meta(state="running")
        s.add_event(Event(at(5), Level.WARNING, Reason.FAILURE_DIAGNOSED.value, "killed", who,
                          {"category": "killed_by_signal_unknown"}))
        s.add_event(Event(at(9), Level.WARNING, Reason.HANG_CONFIRMED.value, "hung", who, {}))
    m = samples(job)
    assert m[("trainguard_diagnoses_total", (("category", "killed_by_signal_unknown"),))] == 1
    assert m[("trainguard_diagnoses_total", (("category", "nccl_timeout_or_hang"),))] == 1
    assert m[("trainguard_hangs_total", ())] == 1
