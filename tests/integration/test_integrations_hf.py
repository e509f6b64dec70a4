"""Hugging Face Trainer under trainguard: a 2-rank CPU (gloo) run of a tiny GPT-2, rank 1
SIGKILLed mid-epoch after leaving a half-written checkpoint directory behind, restarted by
trainguard, ends with the same loss sequence and final weights as an uninterrupted run —
with the one-line integration, and with the unmodified script under `--auto-resume hf`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.conftest import ROOT, read_json, reasons, run_tg, trainer_result

EXAMPLE = ROOT / "examples" / "hf_trainer.py"
STEPS = ["--steps", "14", "--save-every", "4"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[list[float]], str]:
    tmp = tmp_path_factory.mktemp("hf-clean")
    r = run_tg(["run", "--nproc-per-node", "2", "--job-dir", str(tmp / "job"), str(EXAMPLE),
                "--out", str(tmp / "out"), *STEPS], cwd=tmp, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return trainer_result(r.stdout)


@pytest.mark.parametrize("mode", ["integration", "auto-resume"])
def test_a_rank_killed_mid_epoch_resumes_to_the_uninterrupted_losses_and_weights(
        mode: str, tmp_path: Path, uninterrupted: tuple[list[list[float]], str]) -> None:
    flags = ["--auto-resume", "hf"] if mode == "auto-resume" else []
    script = [] if mode == "auto-resume" else ["--trainguard"]
    r = run_tg(["run", "--nproc-per-node", "2", "--max-restarts", "2", *flags, "--job-dir",
                str(tmp_path / "job"), str(EXAMPLE), "--out", str(tmp_path / "out"), *STEPS,
                *script], cwd=tmp_path, timeout=300,
               env={"EXAMPLE_KILL_AT": "6", "EXAMPLE_LEFTOVER": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert reasons(tmp_path / "job").count("WorkersRestarted") == 1
    assert trainer_result(r.stdout) == uninterrupted
    # the kill left checkpoint-1006 half written: the stock resume would have picked it
    from transformers.trainer_utils import get_last_checkpoint

    assert get_last_checkpoint(str(tmp_path / "out")).endswith("checkpoint-1006")
    (rr,) = read_json("recovery", tmp_path / "job")["running_records"][0]["recover_records"]
    # from checkpoint-4; rank 1 died after step 6 (rank 0 may not have reported step 6 yet)
    assert rr["resumed_step"] == 4 and rr["steps_lost"] in (1, 2)
    assert rr["resumed_from"] == "storage"
    if mode == "auto-resume":
        assert "[trainguard] auto-resume: " in r.stdout and "checkpoint-4" in r.stdout
