"""`status` of a job that failed before any attempt started (walk-through 36 #6: every node
failed the same pre-check): its advice names no restart flag, which could not have helped."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.cli import main
from trainguard.controller.store import JobStore


def test_a_job_that_never_started_an_attempt_is_not_told_to_allow_restarts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = tmp_path / "job"
    with JobStore.create(job, "tg-pc") as store:
        store.set_meta(state="failed", max_restarts=0, exit_code=2)
    assert main(["status", str(job)]) == 0
    out = capsys.readouterr().out
    advice = next(ln for ln in out.splitlines() if ln.startswith("continue it:"))
    assert "--max-restarts" not in advice, advice
