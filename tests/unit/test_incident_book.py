"""The incident book's recover records (controller/incidents.py) over a real job store."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from trainguard.controller.incidents import Fault, IncidentBook
from trainguard.controller.store import JobStore
from trainguard.policy.decision import Action, Decision, History, Rung
from trainguard.protocol import NodeReport, Progress
from trainguard.records import FaultScenario, RecoverResult, StartType, utcnow


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
