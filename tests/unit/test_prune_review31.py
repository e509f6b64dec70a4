"""The review of walk-through 31's prune fix: what prune keeps and what it reads.

#1: only *running* jobs protected a dir they use. `run --job-dir B --checkpoint-dir
A/checkpoints` continues from ended job A; once B ended too (failed a minute ago: "run the job
again: it resumes there"), `prune --older-than 1 --yes` deleted A and every checkpoint B wrote,
although B ended a minute ago. A job that ended after the cutoff protects what it uses too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.unit.helpers import tg
from trainguard.controller.store import JobStore
from trainguard.records import utcnow


def _job(job: Path, run_id: str, state: str, ended_at: str, **meta: str) -> Path:
    """An ended job's store, as the launcher leaves it."""
    with JobStore.create(job, run_id) as s:
        s.set_meta(state=state, job_dir=str(job), ended_at=ended_at, **meta)
    return job


def test_prune_keeps_an_old_job_dir_a_job_that_ended_since_checkpointed_into(
        tmp_path: Path) -> None:
    root = tmp_path / "runs"
    a = _job(root / "A", "run-A", "succeeded", "2026-01-01T00:00:00+00:00")
    (a / "logs" / "attempt-0").mkdir(parents=True)
    (a / "checkpoints" / "step-000000010").mkdir(parents=True)
    ck = a / "checkpoints"
    b = _job(tmp_path / "other" / "B", "run-B", "failed", utcnow().isoformat(),
             checkpoint_dir=str(ck))
    (ck / "step-000000500").mkdir()
    (ck / "step-000000500" / "manifest.json").write_text("{}")
    (ck / ".trainguard-job").write_text(json.dumps({"run_id": "run-B", "job_dir": str(b)}))
    r = tg("prune", str(root), "--older-than", "1", "--yes")
    assert r.returncode == 0, r.stderr
    assert (ck / "step-000000500" / "manifest.json").is_file(), (r.stdout, r.stderr)
    assert (a / "trainguard.db").is_file()
    assert f"trainguard prune: note: {a} is not deleted: the job run-B ({b}), which ended " \
        in r.stderr, r.stderr
    assert (f"(not long enough ago), uses {ck} (its checkpoint dir), inside it. Fix: prune it "
            "once that job too ended more than 1 day ago; what that job keeps there goes "
            "with it then") in r.stderr, r.stderr
    assert r.stdout.splitlines()[-1] == (
        "nothing to delete: 1 job ended more than 1 day ago, kept: a job that runs or ended "
        "since uses what it holds (see the note above)"), r.stdout
    # B under ROOT, ended since the cutoff: A is kept too (B itself is not due)
    b2 = _job(root / "B2", "run-B2", "failed", utcnow().isoformat(), checkpoint_dir=str(ck))
    (ck / ".trainguard-job").unlink()
    r = tg("prune", str(root), "--older-than", "1", "--yes")
    assert f"the job run-B2 ({b2}), which ended " in r.stderr, r.stderr
    assert (ck / "step-000000500").is_dir() and b2.is_dir()
    # once both ended long enough ago, both go
    r = tg("prune", str(root), "--older-than", "0", "--yes")
    assert r.returncode == 0, r.stderr
    assert not a.exists() and not b2.exists(), (r.stdout, r.stderr)


def test_prune_walks_only_what_it_would_delete_not_a_projects_own_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
        ) -> None:
    """#5: an ended job run with `--job-dir .` in a project: prune walked the whole project
    (its data, venvs, .git) looking for running jobs, though it keeps those files; it walks
    the dirs it would delete now (a store nested in a kept dir cannot block anything)."""
    import os

    import trainguard.cli.prune as pr
    from trainguard.cli import main

    proj = _job(tmp_path / "runs" / "proj", "run-P", "succeeded", "2026-01-01T00:00:00+00:00")
    (proj / "logs" / "attempt-0").mkdir(parents=True)
    for i in range(30):
        (proj / "data" / f"d{i}").mkdir(parents=True)  # the user's own: prune keeps them
    walked: list[str] = []
    real = os.walk

    def walk(top: Any, *a: Any, **k: Any) -> Any:
        for here, subdirs, files in real(top, *a, **k):
            walked.append(str(here))
            yield here, subdirs, files

    monkeypatch.setattr(pr.os, "walk", walk)
    assert main(["prune", str(tmp_path / "runs"), "--older-than", "1"]) == 0
    assert "would keep what trainguard did not write there: data" in capsys.readouterr().out
    assert walked and not [w for w in walked if "/data" in w], walked


def test_the_architecture_map_and_ops_say_where_prune_lives() -> None:
    """#10: docs/architecture.md put prune in ops.py, and ops.py's docstring listed it."""
    import trainguard.cli.ops as ops

    root = Path(__file__).resolve().parents[2]
    arch = (root / "docs" / "architecture.md").read_text()
    assert "ops.py (stop | ls)," in arch and "prune.py, job_rows.py" in arch
    assert "prune ROOT" not in (ops.__doc__ or "").splitlines()[0]
