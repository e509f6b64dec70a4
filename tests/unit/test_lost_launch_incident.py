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


def test_a_relaunch_reads_the_lost_launch_s_last_step_from_its_rank_logs(
        tmp_path: Path) -> None:
    """Walk-through 40 #3: a launcher killed with SIGKILL at step 230 left the store at step
    227 (progress reaches it in batches); the relaunch ended the attempt at the time of the
    logs' last line, `step 230`, but with step 227, and counted 7 steps done again, not 10.
    The logs' last labelled step is the attempt's last step, and a progress sample."""
    from trainguard.controller.recorder import Recorder
    from trainguard.paths import JobPaths
    from trainguard.spec_build import build_spec

    spec = build_spec(None, {"entrypoint": "train.py", "run_id": "r"})
    job = tmp_path / "job"
    paths = JobPaths(job, job / "logs", job / "ck")
    paths.make()
    rank0 = paths.log_dir / "attempt-0" / "rank-0.log"
    rank0.parent.mkdir(parents=True)
    rank0.write_text("".join(f"{at(s).isoformat()} out {text}\n" for s, text in (
        (27.0, "step 227 loss 0.61"), (28.0, "step 230 loss 0.62"),
        (28.5, "  3%|▏   | 300/9000 [00:01<00:30]"),  # a bar (an evaluation's?): not read
        (29.0, "saving: resumed from step 500"))))  # no step: not the pattern's
    with JobStore.create(job, "r") as store:
        store.set_meta(state="running", attempt=0, last_step=227, created_at=at(0).isoformat(),
                       launches=1)
        store.put_running(RunningRecord(0, at(0), StartType.FIRST_START))
        store.add_progress([(0, 227, at(27).timestamp())])
        Recorder(spec, paths, store, ["train.py"]).begin()
        (lost,) = store.running_records()
        samples = store.progress()
    assert lost.end_reason is not None and lost.last_step == 230, lost
    assert samples[-1] == (0, 230, at(28).timestamp()), samples
