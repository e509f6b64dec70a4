"""Where a job's event stream starts, against the real `trainguard ui` (walk-through 34 #7):
a `Last-Event-ID` or `?after=` that is no whole number in range is a 400 naming it, as on
`/events` (the stream took `after=abc`, `-1`, `1.5` and `Last-Event-ID: x` with a 200 from the
backlog), and `event: job` comes first, as documented (it came after the backlog)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.unit.test_ui_api import make_job, sse
from tests.unit.ui_process import running_ui, stderr_after_stop
from trainguard.ui.catalog import job_id

BAD = [("after", "abc"), ("after", "-1"), ("after", "1.5"), ("after", "9" * 30),
       ("Last-Event-ID", "x"), ("Last-Event-ID", "-5")]


@pytest.fixture
def job(tmp_path: Path) -> Path:
    make_job(tmp_path / "job").close()
    return tmp_path / "job"


def test_a_bad_start_is_a_400_naming_it_as_on_events_and_the_job_comes_first(
        job: Path) -> None:
    with running_ui(job) as (proc, port):
        url = f"http://127.0.0.1:{port}/api/jobs/{job_id(job.resolve())}"
        for name, value in BAD:
            query, headers = ({"after": value}, {}) if name == "after" else ({}, {name: value})
            r = httpx.get(f"{url}/stream", params=query, headers=headers, timeout=10)
            assert r.status_code == 400, (name, value, r.status_code, r.text[:200])
            assert r.json()["error"].startswith(f"{name}="), r.text
            if name == "after":
                same = httpx.get(f"{url}/events", params=query, timeout=10)
                assert (same.status_code, same.json()) == (400, r.json())
        for query in ({}, {"after": ""}, {"after": "3"}):
            r = httpx.get(f"{url}/stream", params=query, timeout=10)
            msgs = sse(r.text)[1:]
            assert r.status_code == 200 and msgs[0]["event"] == "job", r.text[:300]
            assert msgs[-1]["event"] == "end"
        ids = [m["id"] for m in sse(r.text) if m.get("event") == "event"]
        assert ids == ["4", "5", "6", "7"]  # after=3
        err = stderr_after_stop(proc)
    assert "Traceback" not in err, err[-3000:]
