"""`diagnose JOB_DIR`'s reading of a job store (cli/diagnose_job.py) over a real store in a
temporary dir: which attempt is diagnosed, and when none failed."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

from trainguard.cli.diagnose_job import read_job_dir
from trainguard.controller.faults import LOST_END_REASON
from trainguard.controller.store import JobStore, WorkerRow
from trainguard.records import RunningRecord, StartType

T0 = datetime(2026, 12, 3, 12, 0, tzinfo=timezone.utc)


def test_an_attempt_lost_with_its_launcher_then_one_that_succeeded_is_no_failure(
        tmp_path: Path) -> None:
    """Walk-through 10: `stop --force` lost attempt 0, the relaunch succeeded; diagnose said
    'attempt 1 succeeded, and no known error ...' instead of 'no failure found'."""
    job = tmp_path / "job"
    with JobStore.create(job, "run-1") as s:
        s.put_running(RunningRecord(0, T0, StartType.FIRST_START, T0 + timedelta(seconds=9),
                                    LOST_END_REASON))
        s.put_running(RunningRecord(1, T0 + timedelta(seconds=20), StartType.RELAUNCH,
                                    T0 + timedelta(seconds=40), "succeeded"))
        s.put_workers(0, [WorkerRow(0, r, r, "node0", 100 + r, "running") for r in (0, 1)])
        s.put_workers(1, [WorkerRow(1, r, r, "node0", 200 + r, "succeeded", 0)
                          for r in (0, 1)])
    problems: list[str] = []
    got = read_job_dir(job, problems)
    assert got is not None and got.failed is False and got.files == [], got
    assert got.note == ("no attempt of the job failed (attempt 0 was lost with its launcher, "
                        "killed or crashed, and its ranks with it; attempt 1 succeeded)")
