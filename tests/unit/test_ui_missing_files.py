"""A dir the dashboard walks that is not there is an answer, not a crash (review of
walk-through 32 #6): `jobfiles.opened_dir` closed the parent's fd twice when a dir below was
missing or refused, so `/logs` and `/hangs` of a job without `logs/` and `/logs/5/0` of a
job without attempt 5 were 500s with an EBADF traceback, and the second close could hit an
fd another request's thread had just been handed. Against the real `trainguard ui`."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx

from tests.unit.test_ui_api import make_job
from tests.unit.ui_process import running_ui, stderr_after_stop
from trainguard.ui.catalog import job_id


def test_a_job_without_logs_lists_none_and_a_missing_attempt_is_404(tmp_path: Path) -> None:
    fresh, ran = tmp_path / "fresh", tmp_path / "ran"
    make_job(fresh).close()
    shutil.rmtree(fresh / "logs")  # a job that has not started a rank yet
    make_job(ran).close()
    with running_ui(fresh, ran) as (proc, port):
        api = f"http://127.0.0.1:{port}/api/jobs"
        fresh_id, ran_id = job_id(fresh.resolve()), job_id(ran.resolve())
        for path in ("logs", "hangs"):
            r = httpx.get(f"{api}/{fresh_id}/{path}", timeout=10)
            assert r.status_code == 200, (path, r.status_code, r.text)
        assert httpx.get(f"{api}/{fresh_id}/logs", timeout=10).json() == []
        for _ in range(20):  # each a double close before: its fd number reused between
            r = httpx.get(f"{api}/{ran_id}/logs/5/0", timeout=10)
            assert r.status_code == 404, r.text
        assert httpx.get(f"{api}/{ran_id}/logs/0/9", timeout=10).status_code == 404
        assert httpx.get(f"{api}/{ran_id}/logs", timeout=10).json() != []
        err = stderr_after_stop(proc)
    assert "Traceback" not in err and "EBADF" not in err, err[-3000:]
