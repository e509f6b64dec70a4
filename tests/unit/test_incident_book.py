"""The incident book's recover records (controller/incidents.py) over a real job store."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from trainguard.controller.disruption import Disruption
from trainguard.controller.faults import Fault
from trainguard.controller.incidents import IncidentBook
from trainguard.controller.store import JobStore
from trainguard.policy.decision import Action, Decision, History, Rung
from trainguard.protocol import NodeReport, Progress
from trainguard.records import FaultScenario, RecoverRecord, RecoverResult, StartType, utcnow


def test_a_reschedule_overtaken_by_a_second_loss_is_failed_not_a_success(
        tmp_path: Path) -> None:
    """Walk-through 26: two nodes lost at once, one spare: node-0's pod reschedule was
    recorded, then node-1's loss was decided with the same report, whose first step (from
    long before) closed the first record as `success`: it ended 8.7 s before it began, with
    42 steps lost from a resume that never happened, and counted as a recovery."""
    book = IncidentBook(JobStore.create(tmp_path / "job", "r"))
    book.attempt_started(0, StartType.FIRST_START, 29500)
    now = utcnow()
    old = Progress(first_step=1, first_step_at=now - timedelta(seconds=9), last_step=42,
                   last_step_at=now - timedelta(seconds=0.5))

    def fault(node: str) -> Fault:
        t = utcnow()
        return Fault(FaultScenario.NODE_FAULT, f"{node} was lost", f"node {node}: lost",
                     f"node/{node}", t, t, t, old)

    pod = Decision(Action.RESCHEDULE, "node-0 was lost", History(pod_used=1),
                   rung=Rung.POD_RESCHEDULE, start_type=StartType.POD_RESCHEDULE)
    book.record(0, pod, fault("node-0"))
    job = Decision(Action.RESCHEDULE, "node-1 was lost", History(pod_used=1, job_used=1),
                   rung=Rung.JOB_RESCHEDULE, start_type=StartType.JOB_RESCHEDULE)
    book.record(0, job, fault("node-1"))
    first, second = book.current.recover_records if book.current else []
    assert first.recover_result == RecoverResult.FAILED, first
    assert first.first_progress_at is None and first.steps_lost is None
    assert first.recover_end_at is not None and first.recover_end_at >= first.recover_start_at
    assert second.recover_result == RecoverResult.RECOVERING


class _NoNodes:
    """A fleet with no healthy node to place (the I/O layer of NodeRecovery, faked)."""

    nnodes = 2
    nodes: dict[str, object] = {}
    on_spare_lost = None
    disruption = Disruption(30.0)

    def ready(self, name: str) -> bool:
        return False

    def spares(self) -> list[str]:
        return []


def test_a_job_stopped_while_it_queues_for_nodes_is_terminated_not_a_timeout(
        tmp_path: Path) -> None:
    """Walk-through 26: stopped 12 s into its wait for nodes, the job's record said `failed`,
    '(waited 300s for one)', and the metrics counted a failed recovery."""
    from trainguard.controller.nodes import NodeRecovery
    from trainguard.controller.recorder import Recorder
    from trainguard.paths import JobPaths
    from trainguard.spec_build import build_spec

    spec = build_spec(None, {"entrypoint": "train.py", "run_id": "r", "queue_timeout_s": 300})
    paths = JobPaths(tmp_path / "job", tmp_path / "job" / "logs", tmp_path / "job" / "ck")
    paths.make()
    store = JobStore.create(paths.job_dir, "r")
    rec = Recorder(spec, paths, store, ["train.py"])
    rec.book.attempt_started(0, StartType.FIRST_START, 29500)
    nodes = NodeRecovery(rec, _NoNodes())  # type: ignore[arg-type]
    nodes.stop_requested = lambda: True  # the user's stop, during the wait
    t = utcnow()
    d = Decision(Action.RESCHEDULE, "node-1 was lost: isolated", History(job_used=1),
                 rung=Rung.JOB_RESCHEDULE, start_type=StartType.JOB_RESCHEDULE, node="node-1",
                 placement=("node-0",), missing=1)
    out = nodes.carry_out(0, d, NodeReport(node="cluster", attempt=0, workers=[],
                                           progress=Progress(), at=t), (t, t, t))
    assert out.action == Action.GIVE_UP and out.history.job_used == 0  # not spent
    (record,) = store.running_records()[0].recover_records
    assert record.recover_result == RecoverResult.TERMINATED, record
    assert "stopped after waiting 0s for a healthy node" in record.reason
    assert "300s" not in record.reason


def test_a_step_given_up_by_rung_0_is_one_fault_with_the_rung_that_takes_it_over(
        tmp_path: Path) -> None:
    """Walk-through 27: a step failed, was re-executed, failed again (rung 0 out of budget,
    quotaExceeded) and the in-process restart took it over: three incidents were counted
    (the MTBF a third of the run), and the in-process record's detection started 0.16 s
    after the failure it carried on, when the ranks raised the step's error."""
    from trainguard.records import incidents_of

    book = IncidentBook(JobStore.create(tmp_path / "job", "r"))
    book.attempt_started(0, StartType.FIRST_START, 29500)
    p = Progress(first_step=1, first_step_at=utcnow(), last_step=24, last_step_at=utcnow())

    def fault(why: str) -> Fault:
        t = utcnow()
        return Fault(FaultScenario.JOB_FAILED, why, why, "worker-1", t, t, t, p)

    retry = Decision(Action.REEXECUTE, "re-execute step 25", History(),
                     rung=Rung.STEP_REEXECUTION)
    book.step_incident(0, retry, fault("step 25 failed"), 25)
    spent = Decision(Action.DOWNGRADE, "step retries spent", History(),
                     rung=Rung.STEP_REEXECUTION, result=RecoverResult.QUOTA_EXCEEDED)
    second = fault("step 25 failed again")
    book.step_incident(0, spent, second, 25)
    raised = fault("rank 1 raised the step's error")  # the ranks' exit, later
    inproc = Decision(Action.RESTART_RANKS, "rank 1 starts again", History(),
                      rung=Rung.IN_PROCESS_RESTART)
    book.record(0, inproc, raised)
    records = book.current.recover_records if book.current else []
    assert [r.recover for r in records] == ["step_reexecution", "step_reexecution",
                                            "in_process_restart"]
    assert (records[2].fault_at, records[2].detected_at) == (second.fault_at, second.detected)
    assert len(incidents_of([book.current] if book.current else [])) == 2  # failed twice
    # a step given up and then trained past (the script caught the error): the next fault
    # is its own
    book.step_incident(0, spent, fault("step 30 failed"), 30)
    book.progress_seen(Progress(first_step=1, first_step_at=utcnow(), last_step=31,
                                last_step_at=utcnow()))
    later = fault("rank 0 died")
    book.record(0, inproc, later)
    assert book.current is not None and book.current.recover_records[-1].fault_at == \
        later.fault_at


def test_a_script_that_reports_no_steps_recovers_at_its_first_output_line(
        tmp_path: Path) -> None:
    """Walk-through 36 #2: a pod reschedule of a job that reports no steps read `resume -
    total -` and `recovered in -`, though the attempt's first output line was recorded and
    the goodput ledger ends the recovery there."""
    book = IncidentBook(JobStore.create(tmp_path / "job", "r"))
    book.attempt_started(0, StartType.FIRST_START, 29500)
    t = utcnow()
    pod = Decision(Action.RESCHEDULE, "node-1 was lost", History(pod_used=1),
                   rung=Rung.POD_RESCHEDULE, start_type=StartType.POD_RESCHEDULE)
    book.record(0, pod, Fault(FaultScenario.NODE_FAULT, "node-1 was lost", "node node-1: lost",
                              "node/node-1", t, t, t, Progress()))
    book.attempt_started(1, StartType.POD_RESCHEDULE, 29501)
    started = utcnow()
    book.workers_started(started, [False, False])
    book.output_seen(started + timedelta(seconds=3.5))
    book.attempt_succeeded(1, Progress())
    (inc,) = book._store.running_records()[0].recover_records
    assert inc.recover_result == RecoverResult.SUCCESS
    assert inc.first_progress_at == started + timedelta(seconds=3.5)
    assert inc.durations()["resume"] == 3.5 and inc.durations()["total"] is not None


def _restarted_after_a_crash_before_any_step(tmp_path: Path, first_step: int,
                                             resumed: int | None) -> RecoverRecord:
    """The incident of attempt 0, whose rank crashed before reporting any step, once the
    restarted attempt (which resumed from `resumed`, or said nothing) reports `first_step`."""
    book = IncidentBook(JobStore.create(tmp_path / "job", "r"))
    book.attempt_started(0, StartType.FIRST_START, 29500)
    t = utcnow()
    restart = Decision(Action.RESTART, "rank 0 crashed", History(), rung=Rung.PROCESS_RESTART,
                       start_type=StartType.AUTO_RESTART)
    book.record(0, restart, Fault(FaultScenario.JOB_FAILED, "rank 0 crashed", "crash",
                                  "worker-0", t, t, t, Progress()))
    book.attempt_started(1, StartType.AUTO_RESTART, 29501)
    book.workers_started(utcnow(), [False, False])
    if resumed is not None:
        book.resumed(resumed, "storage")
    later = utcnow() + timedelta(seconds=2)
    book.progress_seen(Progress(first_step=first_step, first_step_at=later,
                                last_step=first_step, last_step_at=later))
    (inc,) = book._store.running_records()[0].recover_records
    assert inc.recover_result == RecoverResult.SUCCESS
    return inc


def test_a_crash_before_the_first_step_lost_none_once_the_job_is_seen_to_report_steps(
        tmp_path: Path) -> None:
    """Walk-through 40 #9: a rank that crashed before its first step read `steps lost -`
    (unknown): once the restart reports steps, the job is one that reports them, and the
    failed attempt, which reported none, did none."""
    inc = _restarted_after_a_crash_before_any_step(tmp_path, 1, None)  # no checkpoint
    assert (inc.last_step_before, inc.resumed_step, inc.steps_lost) == (None, 0, 0)


def test_a_job_that_reports_every_tenth_step_lost_an_unknown_number(tmp_path: Path) -> None:
    """Review 49 #6: a job whose progress comes every 10 steps (a checkpoint's, a coarse
    trainguard.progress) may have done 9 steps without a report: its first report after
    the resume (step 10) is not the step after it (0), so steps lost stays unknown."""
    inc = _restarted_after_a_crash_before_any_step(tmp_path, 10, 0)
    assert inc.steps_lost is None
