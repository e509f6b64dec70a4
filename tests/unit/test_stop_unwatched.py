"""`trainguard stop` of a job whose launcher died while its node agents trained on: the
newest checkpoint they committed is recorded, so `status`, `ls` and `metrics` show its
step (walk-through 36 #9: step 64 shown, checkpoints to step 130 committed)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainguard.checkpoint import Checkpointer
from trainguard.cli import main
from trainguard.cli.unwatched import further
from trainguard.controller.store import JobStore


def a_dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_only_a_checkpoint_past_the_last_progress_is_recorded() -> None:
    assert further(130, 64) and further(130, None)
    assert not further(64, 64) and not further(None, 64)


def test_stop_of_a_lost_job_records_the_checkpoints_committed_while_no_controller_watched(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = tmp_path / "job"
    with JobStore.create(job, "tg-or") as store:  # the launcher SIGKILLed at step 64
        store.set_meta(state="running", attempt=0, last_step=64,
                       last_progress_at="2026-12-06T16:08:26.988+00:00",
                       launcher_pid=a_dead_pid(), launcher_host=socket.gethostname())
    ckpt = Checkpointer(job / "checkpoints", async_save=False, keep=10)
    for step in (120, 130):  # the agents' workers trained on and saved
        ckpt.save(step, {"w": torch.zeros(2)})
    ckpt.close()
    assert main(["stop", str(job)]) == 0
    assert "recorded its checkpoint of step 130" in capsys.readouterr().out
    assert main(["status", str(job), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["last_progress"]["step"], doc["last_progress"]["source"]) == (130, "checkpoint")
    assert main(["metrics", str(job)]) == 0
    assert "trainguard_step 130.0" in capsys.readouterr().out
    assert main(["stop", str(job)]) == 0  # a second stop records nothing more
    assert "recorded" not in capsys.readouterr().out
    with JobStore.open(job) as store:
        assert len(store.events(reasons=("CheckpointSaved",))) == 1


def test_another_job_s_newer_checkpoint_in_the_same_dir_is_not_recorded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk skips a step another job committed (review 41 #5: newest_valid's filter)."""
    from trainguard.cli.unwatched import newest_own

    for run_id, step in (("tg-or", 120), ("tg-other", 140)):
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", run_id)
        ckpt = Checkpointer(tmp_path / "ck", async_save=False, keep=10)
        ckpt.save(step, {"w": torch.zeros(2)})
        ckpt.close()
    found = newest_own(str(tmp_path / "ck"), "tg-or")
    assert found is not None and found[0] == 120
    theirs = newest_own(str(tmp_path / "ck"), "tg-other")
    assert theirs is not None and theirs[0] == 140
