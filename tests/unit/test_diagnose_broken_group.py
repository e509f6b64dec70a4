"""`diagnose JOB_DIR` of an attempt whose process group broke and restarted in place, over a
real store (review 37 #8): nobody died, so every rank's row is its final one (exit 0, its
second-last step at the end of the job) and every "the process group failed under this rank"
line looked trained past: it said "no failure found", where docs/cli.md promises the failure
the in-process restart answered."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

from trainguard.cli.diagnose_job import job_reader
from trainguard.controller.store import JobStore, WorkerRow
from trainguard.diagnosis.sources import diagnose_paths
from trainguard.records import (
    FaultScenario,
    RecoverRecord,
    RecoverResult,
    RunningRecord,
    StartType,
)
from trainguard.states import WorkerState

T0 = datetime(2026, 12, 6, 12, 0, tzinfo=timezone.utc)
GLOO = ("RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection "
        "closed by peer [127.0.0.1]:34177. This is typically caused by a remote worker crashing.")


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def test_a_broken_group_restarted_in_place_is_the_failure_diagnosed(tmp_path: Path) -> None:
    job = tmp_path / "job"
    record = RecoverRecord(
        0, at(6), FaultScenario.ERROR_IN_LOG, "the process group failed on rank(s) 0, 1, 2; "
        f"rank(s) 3 blocked in the broken collective, killed: rank 0: {GLOO}", "worker-3",
        recover="in_process_restart", recover_result=RecoverResult.SUCCESS, fault_at=at(5),
        detected_at=at(6), decided_at=at(6.1), workers_started_at=at(6.1),
        recover_end_at=at(8), first_progress_at=at(8), category="nccl_communication_error")
    with JobStore.create(job, "run-1") as s:
        s.put_running(RunningRecord(0, T0, StartType.FIRST_START, at(30), "succeeded",
                                    recover_records=[record]))
        s.put_workers(0, [WorkerRow(0, r, r, "node0", 100 + r, WorkerState.SUCCEEDED, 0,
                                    ended_at=at(30), start_count=2 if r == 3 else 1,
                                    second_last_step_at=at(28)) for r in range(4)])
    logs = job / "logs" / "attempt-0"
    logs.mkdir(parents=True)
    for rank in range(4):
        texts = [(1.0, "step 1 loss 0.5"), (4.0, "step 4 loss 0.4")]
        if rank < 3:
            texts.append((5.0, f"[trainguard.resilient] rank {rank}: the process group failed "
                               f"under this rank ({GLOO}); waiting for the launcher"))
        texts += [(9.0, "step 5 loss 0.3"), (28.0, "step 7 loss 0.2"), (29.0, "step 8 loss 0.1")]
        (logs / f"rank-{rank}.log").write_text("".join(
            f"{at(s).isoformat()} out {t}\n" for s, t in texts))
    report = diagnose_paths([job], read_job=job_reader(None))
    d = report.diagnosis
    assert d is not None and d.evidence is not None, report.problems
    assert d.category.value == "nccl_communication_error", d
    assert "Connection closed by peer" in d.evidence.text and d.evidence.at == at(5)
