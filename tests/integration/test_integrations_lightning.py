"""PyTorch Lightning under trainguard: a 2-rank CPU (gloo) DDP run of a tiny model, rank 1
SIGKILLed mid-epoch after leaving a half-written newer .ckpt behind, restarted by trainguard,
ends with the same loss sequence and final weights as an uninterrupted run — with the
one-line integration (which is then also stopped, `trainguard stop`: the ranks drain, and
run again to the end), and with the unmodified script under `--auto-resume lightning`."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import (
    ROOT,
    TG,
    assert_train_metrics,
    drained_step,
    read_json,
    reasons,
    run_tg,
    trainer_result,
)
from trainguard.integrations.common import file_committed_step

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


@pytest.mark.long  # make test: the stateful-loader test below stops a rank of the same
# unmodified script under --auto-resume lightning (SIGTERM) and checks the losses and weights
# too, and the one-line integration's test SIGKILLs a rank
def test_a_rank_killed_mid_epoch_resumes_to_the_uninterrupted_losses_and_weights(
        tmp_path: Path, uninterrupted: tuple[list[list[float]], str]) -> None:
    """The unmodified script under `--auto-resume lightning`."""
    out = tmp_path / "out"
    r = run_tg(["run", "--nproc-per-node", "2", "--max-restarts", "2", "--auto-resume",
                "lightning", "--job-dir", str(tmp_path / "job"), str(EXAMPLE), "--out",
                str(out), *STEPS], cwd=tmp_path, timeout=300,
               env={"EXAMPLE_KILL_AT": "6", "EXAMPLE_LEFTOVER": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert trainer_result(r.stdout) == uninterrupted
    assert_killed_and_resumed_from_4(tmp_path, r)
    assert "[trainguard] auto-resume: " + str(out / "epoch=0-step=4.ckpt") in r.stdout


def test_one_line_integration_killed_then_stopped_resumes_each_time_exactly(
        tmp_path: Path, uninterrupted: tuple[list[list[float]], str]) -> None:
    """With `fit`, one job: rank 1 is SIGKILLed at step 6 (restarted from step 4), then
    `trainguard stop` comes after step 7 of the restarted attempt: the ranks save a checkpoint
    at the optimizer step they agree on, set `should_stop` and exit (the drain). The same
    command again resumes from that checkpoint and ends as the uninterrupted run; the job's
    metrics hold the loss rank 0 logged last."""
    job, out = tmp_path / "job", tmp_path / "out"
    cmd = ["run", "--nproc-per-node", "2", "--max-restarts", "2", "--job-dir", str(job),
           str(EXAMPLE), "--out", str(out), *STEPS, "--trainguard"]
    r = run_tg(cmd, cwd=tmp_path, timeout=300,
               env={"EXAMPLE_KILL_AT": "6", "EXAMPLE_LEFTOVER": "1", "EXAMPLE_STOP_AT": "7"})
    drained = drained_step(r, job)
    assert 7 < drained < 14
    assert_killed_and_resumed_from_4(tmp_path, r)
    assert [w["exit_code"] for w in read_json("status", job)["ranks"]] == [143, 143]
    again = run_tg(cmd, cwd=tmp_path, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    ckpt = out / f"epoch={(drained - 1) // 10}-step={drained}.ckpt"  # 10 steps an epoch
    assert "Restored all states from the checkpoint at " + str(ckpt) in again.stdout
    losses, digest = trainer_result(again.stdout)
    assert (losses, digest) == uninterrupted
    resumed = [e for e in read_json("events", job) if e["reason"] == "Resumed"]
    assert [e["data"]["step"] for e in resumed] == [4, drained]
    assert "not resumable" not in again.stdout + again.stderr
    assert_train_metrics(job, losses[-1])


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("sig, kill_at, save_every, resumed_at", [
    ("TERM", 13, 4, 12),
    # make test-long: the epoch's last batch (make test runs the state loaded mid-epoch)
    pytest.param("KILL", 11, 5, 10, marks=pytest.mark.long)],
    ids=["mid-epoch-1-sigterm", "epoch-0-end"])
def test_a_stateful_dataloader_resumes_in_a_later_epoch_exactly(
        tmp_path: Path, uninterrupted: tuple[list[list[float]], str], sig: str, kill_at: int,
        save_every: int, resumed_at: int) -> None:
    """torchdata's StatefulDataLoader (Lightning's DistributedSampler in it), rank 1 killed
    in the second epoch: resumed from step 12 (mid-epoch 1) or 10 (the first epoch's last
    batch) it ends as the uninterrupted run. Lightning alone went on in epoch 0's order
    (torchdata draws the sampler's order when the state is loaded, before Lightning sets the
    epoch), and from step 10 it skipped the next epoch. The kill is TRAINGUARD_FAULT's, as a
    user would inject it (walk-through 35 F6: the example ignored it, and the job
    "survived" a kill it never had). A SIGTERM is restarted too: Lightning turns it into a
    SystemExit without a code, and rank 1 exited 0 (walk-through 39 #1)."""
    pytest.importorskip("torchdata.stateful_dataloader")
    out = tmp_path / "out"
    args = [*STEPS[:2], "--save-every", str(save_every), *STEPS[4:]]
    r = run_tg(["run", "--nproc-per-node", "2", "--max-restarts", "1", "--auto-resume",
                "lightning", "--job-dir", str(tmp_path / "job"), str(EXAMPLE), "--out",
                str(out), *args], cwd=tmp_path, timeout=300,
               fault=f"signal:{sig}@step={kill_at},rank=1",
               env={"EXAMPLE_STATEFUL_LOADER": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert reasons(tmp_path / "job").count("WorkersRestarted") == 1
    ckpt = out / f"epoch={(resumed_at - 1) // 10}-step={resumed_at}.ckpt"
    assert "Restored all states from the checkpoint at " + str(ckpt) in r.stdout
    losses, digest = trainer_result(r.stdout)
    assert [s for s, _ in losses] == list(range(1, 15))
    assert (losses, digest) == uninterrupted


def assert_killed_and_resumed_from_4(tmp_path: Path, r: Any) -> None:
    out = tmp_path / "out"
    assert reasons(tmp_path / "job").count("WorkersRestarted") == 1
    # the kill left a half-written epoch=0-step=1006.ckpt, the highest step there
    assert (out / "epoch=0-step=1006.ckpt").is_file()
    assert "Restored all states from the checkpoint at " + str(out / "epoch=0-step=4.ckpt") \
        in r.stdout
    rr = read_json("recovery", tmp_path / "job")["running_records"][0]["recover_records"][0]
    # from step 4; rank 1 died after step 6 (steps this short: progress, sent at most every
    # 0.2 s, may not have reported 5 or 6)
    assert rr["resumed_step"] == 4 and rr["steps_lost"] <= 2
    assert rr["resumed_from"] == "storage"
    assert "not resumable" not in r.stdout + r.stderr  # the loader's state came back


@pytest.fixture(scope="module")
def accumulated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[list[float]]]:
    """A job accumulating gradients over 2 batches (5 optimizer steps an epoch), 8 steps,
    a ModelCheckpoint every 4 with save_last=True (epoch=E-step=S.ckpt, then last.ckpt)."""
    tmp = tmp_path_factory.mktemp("pl-accumulated")
    r = run_tg(["run", "--nproc-per-node", "2", "--auto-resume", "lightning", "--job-dir",
                str(tmp / "job"), str(EXAMPLE), "--out", str(tmp / "out"), "--steps", "8",
                "--save-every", "4", "--samples", "160"], cwd=tmp, timeout=300,
               env={"EXAMPLE_ACCUMULATE": "2", "EXAMPLE_SAVE_LAST": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    losses, _ = trainer_result(r.stdout)
    # one [step, loss] per training_step call: two batches (one step) at a time
    assert [s for s, _ in losses] == [s for s in range(1, 9) for _ in range(2)]
    return tmp, losses


def test_with_accumulated_gradients_the_loss_reported_is_the_one_training_step_returned(
        accumulated: tuple[Path, list[list[float]]]) -> None:
    """(walk-through 29, #2) Lightning hands the callbacks the loss divided by
    accumulate_grad_batches: status and metrics showed half the loss."""
    tmp, losses = accumulated
    assert_train_metrics(tmp / "job", losses[-1])  # step 8's second batch, as returned


def test_save_last_commits_last_ckpt_but_counts_each_step_saved_once(
        accumulated: tuple[Path, list[list[float]]]) -> None:
    """(walk-through 29, #3) With save_last=True every save wrote epoch=E-step=S.ckpt and,
    ms later, last.ckpt: two CheckpointSaved events, so the checkpoint interval (report,
    metric) was the gap between the two writes. last.ckpt is still committed (resume may
    take it)."""
    from trainguard.integrations.common import file_committed_step

    tmp, _ = accumulated
    saves = [e for e in read_json("events", tmp / "job") if e["reason"] == "CheckpointSaved"]
    assert [(e["data"]["step"], Path(e["data"]["location"]).name) for e in saves] == [
        (4, "epoch=0-step=4.ckpt"), (8, "epoch=1-step=8.ckpt")]
    assert file_committed_step(tmp / "out" / "last.ckpt") == 8
    assert file_committed_step(tmp / "out" / "epoch=1-step=8.ckpt") == 8
    # the interval is the gap from step 4's save to step 8's, not the ms to last.ckpt
    text = subprocess.run([*TG, "metrics", str(tmp / "job")], capture_output=True, text=True,
                          check=True, timeout=60).stdout
    (interval,) = [float(line.split()[1]) for line in text.splitlines()
                   if line.startswith("trainguard_checkpoint_interval_seconds ")]
    gap = saves[1]["data"]["sent_at"] - saves[0]["data"]["sent_at"]
    assert interval == pytest.approx(gap, abs=0.002)


def test_a_damaged_committed_ckpt_is_told_and_the_one_before_it_taken(
        tmp_path: Path, accumulated: tuple[Path, list[list[float]]]) -> None:
    """(walk-through 29, #11) The newest committed .ckpt files (step 8 and its last.ckpt)
    truncated since their commit: the job resumes from step 4 and says why, a Warning
    CheckpointCorrupt for each from rank 0 (HF's directories had it, Lightning's files were
    skipped silently)."""
    import shutil

    out = tmp_path / "out"
    shutil.copytree(accumulated[0] / "out", out)
    for name in ("epoch=1-step=8.ckpt", "last.ckpt"):
        with open(out / name, "r+b") as f:
            f.truncate(5000)
    r = run_tg(["run", "--nproc-per-node", "2", "--auto-resume", "lightning", "--job-dir",
                str(tmp_path / "job"), str(EXAMPLE), "--out", str(out), "--steps", "10",
                "--save-every", "4", "--samples", "160"], cwd=tmp_path, timeout=300,
               env={"EXAMPLE_ACCUMULATE": "2", "EXAMPLE_SAVE_LAST": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Restored all states from the checkpoint at " + str(out / "epoch=0-step=4.ckpt") \
        in r.stdout
    events = read_json("events", tmp_path / "job")
    corrupt = sorted((e["level"], e["involved"]["rank"], e["message"])
                     for e in events if e["reason"] == "CheckpointCorrupt")
    assert [c[:2] for c in corrupt] == [("Warning", 0)] * 2
    for c, name in zip(corrupt, ["epoch=1-step=8.ckpt", "last.ckpt"], strict=True):
        assert c[2].startswith(f"checkpoint of step 8 skipped (damaged): {name} is 5000 bytes, ")
        assert c[2].endswith(f" when it was committed; the one before it is tried; set aside "
                             f"as {name}.damaged, so that the step's next save takes its name")
    assert [e["data"]["step"] for e in events if e["reason"] == "Resumed"] == [4]
    # walk-through 39 #13: whichever rank's Resumed came first, it says what explains it
    assert next(e["message"] for e in events if e["reason"] == "Resumed").endswith(
        " (the newer checkpoint of step 8 is damaged and was skipped: CheckpointCorrupt says "
        "why)")
    # walk-through 35 F12: the step's re-save takes the names again (it went to `-v1`
    # beside the damaged file, which stayed marked: `ckpt verify` failed from then on)
    assert not (out / "epoch=1-step=8-v1.ckpt").exists()
    assert file_committed_step(out / "epoch=1-step=8.ckpt") == 8
    assert (out / "epoch=1-step=8.ckpt.damaged").stat().st_size == 5000
    r = run_tg(["ckpt", "verify", str(out)], cwd=tmp_path, timeout=60)
    assert r.returncode == 0 and "is valid" in r.stdout, r.stdout + r.stderr


VALIDATION_HANG = """\
import time
import torch
import pytorch_lightning as pl
from torch.utils.data import DataLoader, TensorDataset
from trainguard.integrations.lightning import fit


class M(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 1)

    def training_step(self, batch, i):
        x, y = batch
        return torch.nn.functional.mse_loss(self.lin(x), y)

    def validation_step(self, batch, i):
        print(f"validation batch {i}", flush=True)
        time.sleep(600 if i == 2 else 4)  # two slow batches, then one that never returns

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


torch.manual_seed(0)
data = TensorDataset(torch.randn(32, 2), torch.randn(32, 1))
trainer = pl.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False,
                     enable_progress_bar=False, enable_model_summary=False,
                     enable_checkpointing=False, num_sanity_val_steps=0)
fit(trainer, M(), DataLoader(data, batch_size=4), DataLoader(data, batch_size=4))
"""


def test_a_validation_batch_that_never_returns_is_a_hang_within_the_batch_allowance(
        tmp_path: Path) -> None:
    """Review 48 #1: the validation phase (review 47 #1) had the 30-minute phase allowance,
    so a batch that never returned (a DDP evaluation whose ranks disagree on a collective,
    a stuck loader) went unconfirmed that long, whatever --hang-timeout said. Each batch
    renews the phase with TRAINGUARD_EVAL_BATCH_S (here 6 s, above the fixed 3 s threshold):
    two 4 s batches pass (longer than the threshold, and together than the allowance), the
    third is confirmed hung in the validation phase; the hang is left running (no
    --restart-on-hang) and `trainguard stop` ends it."""
    import os
    import time

    script = tmp_path / "val_hang.py"
    script.write_text(VALIDATION_HANG)
    job = tmp_path / "job"
    proc = subprocess.Popen(
        [*TG, "run", "--nproc-per-node", "1", "--job-dir", str(job), "--hang-timeout", "3",
         str(script)], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "TRAINGUARD_EVAL_BATCH_S": "6"})
    try:
        deadline = time.monotonic() + 150
        events: list[dict[str, Any]] = []
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(1)
            if (job / "trainguard.db").exists():
                events = read_json("events", job)
                if any(e["reason"] == "HangConfirmed" for e in events):
                    break
        confirmed = [e["message"] for e in events if e["reason"] == "HangConfirmed"]
        assert len(confirmed) == 1 and "phase 'validation' allowance 6s" in confirmed[0], \
            [e["message"] for e in events][-5:]
        suspected = [e["message"] for e in events if e["reason"] == "HangSuspected"]
        assert all("phase 'validation'" in m for m in suspected), suspected
    finally:
        subprocess.run([*TG, "stop", str(job)], cwd=tmp_path, capture_output=True, timeout=60)
        out, _ = proc.communicate(timeout=60)
    assert "validation batch 2" in out and "validation batch 3" not in out, out[-3000:]
