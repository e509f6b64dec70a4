"""A job store holding one value that does not decode (a time that is no time, JSON that is
no JSON, a step that is no number, a state nobody wrote) is a damaged store, said once by the
store's readers (walk-through 34 #3): before, one such store under `ui --root` made
`GET /api/jobs` a 500 for every job, its own routes were 500s, not the documented 503, and
`status`, `report`, `recovery`, `metrics` and `events` ended in a Python traceback. Against
the real `trainguard ui` and the real commands."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import httpx
import pytest

from tests.unit.test_ui_api import make_job
from tests.unit.ui_process import running_ui, stderr_after_stop
from trainguard.cli import main as cli_main
from trainguard.ui.catalog import job_id

# one bad value per table, written as someone editing or damaging the file would
DAMAGE = {
    "record": "UPDATE running_records SET data = replace(data, '\"start_at\": \"', "
              "'\"start_at\": \"garbage') WHERE attempt = 0",
    "meta": "UPDATE meta SET value = '\"yesterday\"' WHERE key = 'created_at'",
    "event-data": "UPDATE events SET data = '{notjson' WHERE reason = 'FailureDiagnosed'",
    "event-time": "UPDATE events SET time = 'noon' WHERE reason = 'CheckpointSaved'",
    "worker": "UPDATE workers SET state = 'weird' WHERE rank = 1",
    "progress": "UPDATE progress SET step = 'abc' WHERE rowid = 3",
}
FIX = "Fix: the store is damaged; move it"


def damaged(tmp_path: Path, good: Path, what: str) -> Path:
    """A copy of the job `good` with DAMAGE[what] done to its store."""
    d = tmp_path / "root" / what
    shutil.copytree(good, d)
    with sqlite3.connect(d / "trainguard.db") as conn:
        assert conn.execute(DAMAGE[what]).rowcount >= 1, what
    return d


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """ROOT: a good job and one damaged copy of it per DAMAGE, side by side."""
    good = tmp_path / "root" / "good"
    make_job(good).close()
    for what in DAMAGE:
        damaged(tmp_path, good, what)
    return tmp_path / "root"


def test_one_damaged_store_under_the_root_leaves_the_list_and_its_neighbours_readable(
        root: Path) -> None:
    with running_ui(root=root) as (proc, port):
        api = f"http://127.0.0.1:{port}/api/jobs"
        r = httpx.get(api, timeout=30)
        assert r.status_code == 200, r.text[-2000:]
        rows = {row["id"].rsplit("-", 1)[0]: row for row in r.json()}
        assert set(rows) == {"good", *DAMAGE}
        assert rows["good"]["error"] is None and rows["good"]["state"] == "succeeded"
        for what in ("record", "meta"):  # what a row is made of: the row says why not
            assert rows[what]["state"] is None and FIX in rows[what]["error"], rows[what]
            assert "cannot be decoded" in rows[what]["error"]
        for what in ("record", "meta", "event-data", "event-time", "worker"):
            jid = job_id((root / what).resolve())
            for path in ("", "/stream", *(["/events"] if what.startswith("event") else [])):
                got = httpx.get(f"{api}/{jid}{path}", timeout=30)
                assert got.status_code == 503, (what, path, got.status_code, got.text[:300])
                assert FIX in got.json()["error"], (what, path)
        view = httpx.get(f"{api}/{job_id((root / 'progress').resolve())}", timeout=30)
        assert view.status_code == 200  # only the goodput reads the progress: it says why
        assert FIX in view.json()["goodput_detail"]["error"]
        assert httpx.get(f"{api}/{job_id((root / 'good').resolve())}",
                         timeout=30).status_code == 200
        err = stderr_after_stop(proc)
    assert "Traceback" not in err, err[-3000:]


@pytest.mark.parametrize("what", sorted(DAMAGE))
def test_the_read_commands_say_the_store_is_damaged_in_one_line(
        root: Path, what: str, capsys: pytest.CaptureFixture[str]) -> None:
    failed = []
    for command in ("status", "report", "recovery", "metrics", "events"):
        code = cli_main([command, str(root / what)])
        err = capsys.readouterr().err
        if code != 0:
            assert code == 2 and err.count("\n") == 1, (command, code, err)
            assert err.startswith(f"trainguard {command}: error: cannot read ") and FIX in err
            failed.append(command)
    assert failed, f"no command read the damaged {what}"
