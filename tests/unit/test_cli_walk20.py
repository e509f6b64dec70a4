"""Walk-through 20's job-file nit: a flag's spelling in a job file (`max-restarts`) is the
key's (`max_restarts`), as docs/cli.md says; both in one file is a key given twice, refused
with its lines, not one silently taking the other's place."""

from __future__ import annotations

import json
from pathlib import Path

from tests.unit.helpers import tg


def test_a_flags_spelling_in_a_job_file_is_read_as_the_key(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "job.yaml").write_text("entrypoint: train.py\nmax-restarts: 5\n")
    r = tg("run", "--config", "job.yaml", "--dry-run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["max_restarts"] == 5 and doc["from"]["max_restarts"] == "the job file job.yaml"


def test_both_spellings_of_one_key_are_a_key_given_twice(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "job.yaml").write_text("entrypoint: train.py\nmax-restarts: 5\n"
                                       "max_restarts: 2\n")
    r = tg("run", "--config", "job.yaml", "--dry-run", cwd=tmp_path)
    assert r.returncode == 2
    assert ("job file job.yaml: max_restarts: given twice (lines 2 and 3). Fix: keep one"
            in r.stderr), r.stderr


def test_a_changed_script_is_named_as_the_script_not_as_a_flag_that_does_not_exist() -> None:
    """SettingsChanged said `--entrypoint-path /p/a.py -> /p/b.py` (walk-through 20, nit 8):
    no such flag; the script is what changed."""
    from trainguard.controller.launch_settings import changes_text

    assert changes_text({"entrypoint_path": ("/p/a.py", "/p/b.py")}) == (
        "the script /p/a.py -> /p/b.py")
