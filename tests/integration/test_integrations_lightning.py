"""PyTorch Lightning under trainguard: a 2-rank CPU (gloo) DDP run of a tiny model, rank 1
SIGKILLed mid-epoch after leaving a half-written newer .ckpt behind, restarted by trainguard,
ends with the same loss sequence and final weights as an uninterrupted run — with the
one-line integration, and with the unmodified script under `--auto-resume lightning`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.conftest import ROOT, read_json, reasons, run_tg, trainer_result

EXAMPLE = ROOT / "examples" / "lightning_trainer.py"
# 160 samples, 2 ranks, batches of 8: 10 steps an epoch; killed at 6 (mid-epoch 0), resumed
# from step 4 (mid-epoch 0 too), finishing in epoch 1
STEPS = ["--steps", "14", "--save-every", "4", "--samples", "160"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[list[float]], str]:
    tmp = tmp_path_factory.mktemp("pl-clean")
    r = run_tg(["run", "--nproc-per-node", "2", "--job-dir", str(tmp / "job"), str(EXAMPLE),
                "--out", str(tmp / "out"), *STEPS], cwd=tmp, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    losses, digest = trainer_result(r.stdout)
    assert [s for s, _ in losses] == list(range(1, 15))
    return losses, digest


@pytest.mark.parametrize("mode", ["integration", "auto-resume"])
def test_a_rank_killed_mid_epoch_resumes_to_the_uninterrupted_losses_and_weights(
        mode: str, tmp_path: Path, uninterrupted: tuple[list[list[float]], str]) -> None:
    flags = ["--auto-resume", "lightning"] if mode == "auto-resume" else []
    script = [] if mode == "auto-resume" else ["--trainguard"]
    out = tmp_path / "out"
    r = run_tg(["run", "--nproc-per-node", "2", "--max-restarts", "2", *flags, "--job-dir",
                str(tmp_path / "job"), str(EXAMPLE), "--out", str(out), *STEPS, *script],
               cwd=tmp_path, timeout=300, env={"EXAMPLE_KILL_AT": "6", "EXAMPLE_LEFTOVER": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert reasons(tmp_path / "job").count("WorkersRestarted") == 1
    assert trainer_result(r.stdout) == uninterrupted
    # the kill left a half-written epoch=0-step=1006.ckpt, the highest step there
    assert (out / "epoch=0-step=1006.ckpt").is_file()
    assert "Restored all states from the checkpoint at " + str(out / "epoch=0-step=4.ckpt") \
        in r.stdout
    (rr,) = read_json("recovery", tmp_path / "job")["running_records"][0]["recover_records"]
    # from step 4; rank 1 died after step 6 (steps this short: progress, sent at most every
    # 0.2 s, may not have reported 5 or 6)
    assert rr["resumed_step"] == 4 and rr["steps_lost"] <= 2
    assert rr["resumed_from"] == "storage"
    assert "not resumable" not in r.stdout + r.stderr  # the loader's state came back
    if mode == "auto-resume":
        assert "[trainguard] auto-resume: " + str(out / "epoch=0-step=4.ckpt") in r.stdout
