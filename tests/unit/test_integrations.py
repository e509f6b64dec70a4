"""The trainer integrations' shared parts: which checkpoint a restart resumes from, and the
site hook that patches a framework when the script imports it."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from trainguard.integrations import autoresume
from trainguard.integrations.common import (
    COMMIT_MARKER,
    checkpoint_files,
    file_committed_step,
    file_marker,
    is_committed,
    mark_committed,
    mark_file_committed,
    newest,
    newest_file,
    numbered_dirs,
    unmark_file,
)
from trainguard.integrations.hf import last_checkpoint
from trainguard.worker.contract import ENV_SOCKET


def ckpt(root: Path, n: int, *, state: bool = True, marked: bool = False,
         sentinel: bool = False) -> Path:
    d = root / f"checkpoint-{n}"
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(b"x")
    if state:
        (d / "trainer_state.json").write_text("{}")
    if sentinel:
        (d / "checkpoint-is-incomplete.txt").write_text("")
    if marked:
        mark_committed(d, n)
    return d


def test_an_explicit_checkpoint_never_committed_is_replaced_by_the_newest_committed(
        tmp_path: Path) -> None:
    """Walk-through 25: `train(resume_from_checkpoint=get_last_checkpoint(out))` under
    --auto-resume hf picked the half-written checkpoint a killed rank left, and every restart
    failed loading it; the newest committed one is used instead. A path elsewhere, or a job
    with nothing committed, stays the script's choice."""
    from trainguard.integrations.hf import _committed_instead

    out = tmp_path / "out"
    ckpt(out, 15, marked=True)
    torn = ckpt(out, 1022, state=False)  # what get_last_checkpoint returns
    assert _committed_instead(out, str(torn)) == (
        str(out / "checkpoint-15"),
        "was never committed (a save cut short: get_last_checkpoint picks it)")
    assert _committed_instead(out, out / "checkpoint-15") is None  # committed: kept
    assert _committed_instead(out, str(ckpt(tmp_path / "other", 30))) is None
    assert _committed_instead(tmp_path / "other", str(tmp_path / "other" / "checkpoint-30")) \
        is None  # nothing committed there: the script's choice


def test_the_newest_committed_checkpoint_wins_over_newer_unmarked_ones(tmp_path: Path) -> None:
    ckpt(tmp_path, 4, marked=True)
    ckpt(tmp_path, 8)  # complete, but its commit never happened (a rank died)
    ckpt(tmp_path, 1006, state=False)  # a save cut short
    assert last_checkpoint(tmp_path) == str(tmp_path / "checkpoint-4")
    assert is_committed(tmp_path / "checkpoint-4") and not is_committed(tmp_path / "checkpoint-8")


def test_a_committed_checkpoint_damaged_since_is_skipped_for_the_one_before(
        tmp_path: Path) -> None:
    """(walk-through 22) A committed checkpoint-35 whose model.safetensors was truncated was
    resumed from, failed to load, and failed again at every restart. The marker records each
    file's size: a file gone or of another size skips it, and the one before is taken."""
    ckpt(tmp_path, 30, marked=True)
    d = ckpt(tmp_path, 35, marked=True)
    assert json.loads((d / COMMIT_MARKER).read_text())["files"] == {
        "model.safetensors": 1, "trainer_state.json": 2}
    assert last_checkpoint(tmp_path) == str(d)
    (d / "model.safetensors").write_bytes(b"")  # truncated
    assert last_checkpoint(tmp_path) == str(tmp_path / "checkpoint-30")
    (d / "model.safetensors").write_bytes(b"x")
    (d / "trainer_state.json").unlink()  # a file gone
    assert last_checkpoint(tmp_path) == str(tmp_path / "checkpoint-30")
    (tmp_path / "checkpoint-30" / "model.safetensors").write_bytes(b"xy")
    assert last_checkpoint(tmp_path) is None  # none intact: start fresh, never an unmarked one


def test_a_marker_written_before_sizes_were_recorded_still_commits(tmp_path: Path) -> None:
    d = ckpt(tmp_path, 4)
    (d / COMMIT_MARKER).write_text(json.dumps({"step": 4, "committed_at": 0}))
    assert last_checkpoint(tmp_path) == str(d)


def test_without_any_marker_the_newest_complete_one_counts(tmp_path: Path) -> None:
    ckpt(tmp_path, 3)
    ckpt(tmp_path, 6, sentinel=True)  # Trainer's own save-on-SIGTERM left it incomplete
    ckpt(tmp_path, 9, state=False)
    assert last_checkpoint(tmp_path) == str(tmp_path / "checkpoint-3")


def test_a_first_attempt_has_nothing_to_resume_and_that_is_no_error(tmp_path: Path) -> None:
    assert last_checkpoint(tmp_path / "not-yet") is None
    assert last_checkpoint(None) is None
    ckpt(tmp_path, 2, state=False)
    assert last_checkpoint(tmp_path) is None


def test_an_unreadable_marker_trusts_nothing_unmarked(tmp_path: Path) -> None:
    ckpt(tmp_path, 5)
    (ckpt(tmp_path, 7) / COMMIT_MARKER).write_text("{not json")
    found = newest(numbered_dirs(tmp_path, r"checkpoint-(\d+)"), lambda d: True)
    assert found is None


def test_the_site_hook_patches_the_framework_right_after_the_script_imports_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "fakefw.py").write_text("class Trainer:\n    def train(self):\n        "
                                        "return 'plain'\n")
    (tmp_path / "fakepatch.py").write_text(
        "import fakefw\n\ndef patch():\n    fakefw.Trainer.train = lambda self: 'patched'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(autoresume.TARGETS, "fake", ("fakefw", "fakepatch"))
    monkeypatch.setenv("TRAINGUARD_AUTO_RESUME", "fake")
    before = list(sys.meta_path)
    monkeypatch.setattr(sys, "meta_path", before[:])
    for name in ("fakefw", "fakepatch"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    autoresume.install()
    import fakefw  # type: ignore[import-not-found]

    assert fakefw.Trainer().train() == "patched"


def test_without_the_variable_the_hook_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRAINGUARD_AUTO_RESUME", raising=False)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    n = len(sys.meta_path)
    autoresume.install()
    assert len(sys.meta_path) == n


# -- single-file checkpoints (Lightning's .ckpt): the sidecar marker --------------------------

def ckpt_file(root: Path, step: int, *, marked: bool = False, whole: bool = True) -> Path:
    """A .ckpt as Lightning names it: a whole zip (what torch.save writes) or a cut one."""
    import zipfile

    root.mkdir(parents=True, exist_ok=True)
    f = root / f"epoch=0-step={step}.ckpt"
    if whole:
        with zipfile.ZipFile(f, "w") as z:
            z.writestr("archive/data.pkl", b"x" * 10)
    else:
        f.write_bytes(b"PK\x03\x04" + b"\0" * 100)
    if marked:
        mark_file_committed(f, step)
    return f


def test_a_committed_file_carries_a_sidecar_with_its_step_and_size(tmp_path: Path) -> None:
    f = ckpt_file(tmp_path, 8, marked=True)
    assert file_marker(f) == tmp_path / "epoch=0-step=8.ckpt.trainguard-committed"
    assert file_committed_step(f) == 8
    assert not list(tmp_path.glob("*.tmp"))  # written atomically
    assert checkpoint_files(tmp_path, ".ckpt") == [f]  # the marker is no checkpoint


def test_a_file_rewritten_or_gone_after_its_commit_no_longer_counts(tmp_path: Path) -> None:
    f = ckpt_file(tmp_path, 4, marked=True)
    f.write_bytes(b"PK\x03\x04")  # overwritten in place and cut short
    assert file_committed_step(f) is None
    g = ckpt_file(tmp_path, 6, marked=True)
    g.unlink()
    assert file_committed_step(g) is None
    h = ckpt_file(tmp_path, 9, marked=True)
    unmark_file(h)
    unmark_file(h)  # twice is fine
    assert file_committed_step(h) is None and not file_marker(h).exists()


def test_the_newest_committed_file_wins_over_newer_unmarked_ones(tmp_path: Path) -> None:
    def step_in_name(f: Path) -> int | None:
        return int(f.name.split("step=")[1].split(".")[0])

    ckpt_file(tmp_path, 4, marked=True)
    ckpt_file(tmp_path, 8)  # whole, but never committed (the save's commit never ran)
    ckpt_file(tmp_path, 1006, whole=False)  # a save cut short
    found = newest_file(checkpoint_files(tmp_path, ".ckpt"), step_in_name)
    assert found == (4, tmp_path / "epoch=0-step=4.ckpt")
    (file_marker(tmp_path / "epoch=0-step=4.ckpt")).write_text("{not json")
    # a marker is there but none holds: trust nothing unmarked
    assert newest_file(checkpoint_files(tmp_path, ".ckpt"), step_in_name) is None
    assert newest_file([], step_in_name) is None


def test_a_damaged_committed_file_is_told_from_rank_0_and_the_one_before_it_taken(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """(walk-through 29, #11) As `newest` for directories: each damaged committed file newer
    than the one taken is a CheckpointCorrupt with why, told by rank 0 only."""
    def step_in_name(f: Path) -> int | None:
        return None

    ckpt_file(tmp_path, 4, marked=True)
    old = ckpt_file(tmp_path, 2, marked=True)
    old.write_bytes(b"PK")  # damaged too, but older than the one taken: not looked at
    for step in (8, 12):
        ckpt_file(tmp_path, step, marked=True).write_bytes(b"PK\x03\x04")
    files = checkpoint_files(tmp_path, ".ckpt")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as launcher:
        launcher.bind(str(tmp_path / "s"))
        launcher.settimeout(0.5)
        monkeypatch.setenv(ENV_SOCKET, str(tmp_path / "s"))
        monkeypatch.setenv("RANK", "1")
        assert newest_file(files, step_in_name) == (4, tmp_path / "epoch=0-step=4.ckpt")
        monkeypatch.setenv("RANK", "0")
        assert newest_file(files, step_in_name) == (4, tmp_path / "epoch=0-step=4.ckpt")
        got = []
        with contextlib.suppress(TimeoutError):
            while True:
                got.append(json.loads(launcher.recv(65536)))
    size = (tmp_path / "epoch=0-step=4.ckpt").stat().st_size
    assert [(m["kind"], m["step"], m["status"], m["reason"], m["location"]) for m in got] == [
        ("checkpoint_corrupt", s, "damaged", f"epoch=0-step={s}.ckpt is 4 bytes, {size} when "
         f"it was committed; the one before it is tried; set aside as epoch=0-step={s}.ckpt"
         ".damaged, so that the step's next save takes its name",
         str(tmp_path / f"epoch=0-step={s}.ckpt")) for s in (12, 8)]
    # walk-through 35 F12: left marked, the damaged file kept its name, Lightning's re-save
    # of the step went to `-v1` beside it, and `ckpt verify` failed from then on
    for s in (12, 8):
        gone = tmp_path / f"epoch=0-step={s}.ckpt"
        assert not gone.exists() and not file_marker(gone).exists()
        assert (tmp_path / f"epoch=0-step={s}.ckpt.damaged").read_bytes() == b"PK\x03\x04"
    assert file_marker(old).exists()  # older than the one taken: not looked at
    assert set(checkpoint_files(tmp_path, ".ckpt")) == {tmp_path / "epoch=0-step=4.ckpt", old}


def test_lightning_resumes_from_the_newest_committed_ckpt_or_none(tmp_path: Path) -> None:
    from trainguard.integrations import lightning

    assert lightning.last_checkpoint(tmp_path / "not-yet") is None
    assert lightning.last_checkpoint(None) is None
    ckpt_file(tmp_path / "a", 1006, whole=False)
    assert lightning.last_checkpoint(tmp_path / "a") is None  # cut short: no zip directory
    ckpt_file(tmp_path / "a", 3)  # saved before trainguard ran the job: whole, so it counts
    assert lightning.last_checkpoint(tmp_path / "a") == str(tmp_path / "a/epoch=0-step=3.ckpt")
    ckpt_file(tmp_path / "b", 4, marked=True)
    ckpt_file(tmp_path / "b", 8)
    ckpt_file(tmp_path / "b", 1006, whole=False)
    assert lightning.last_checkpoint(tmp_path / "b") == str(tmp_path / "b/epoch=0-step=4.ckpt")


def test_the_lightning_checkpoint_io_commits_after_the_write_and_unmarks_on_remove(
        tmp_path: Path) -> None:
    from trainguard.integrations.lightning import TrainguardCheckpointIO

    io = TrainguardCheckpointIO()
    f = tmp_path / "epoch=0-step=5.ckpt"
    io.save_checkpoint({"global_step": 5, "state_dict": {}}, f)
    assert file_committed_step(f) == 5
    assert io.load_checkpoint(f)["global_step"] == 5
    io.remove_checkpoint(f)
    assert not f.exists() and not file_marker(f).exists()


def test_under_trainguard_lightnings_slurm_requeue_is_switched_off_and_said(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from pytorch_lightning import Trainer
    from pytorch_lightning.plugins.environments import (  # type: ignore[attr-defined]
        SLURMEnvironment,
    )

    from trainguard.integrations import lightning

    monkeypatch.setattr("trainguard.worker.channel.available", lambda: True)
    trainer = Trainer(accelerator="cpu", devices=1, plugins=[SLURMEnvironment()], logger=False,
                      default_root_dir=tmp_path, enable_progress_bar=False)
    env = trainer._accelerator_connector.cluster_environment
    assert isinstance(env, SLURMEnvironment)
    before = env.auto_requeue
    lightning.prepare(trainer)
    lightning.prepare(trainer)  # idempotent
    assert before and not env.auto_requeue
    assert "switched off Lightning's Slurm auto-requeue" in capsys.readouterr().err
    assert isinstance(trainer.strategy.checkpoint_io, lightning.TrainguardCheckpointIO)
    assert not isinstance(trainer.strategy.checkpoint_io.checkpoint_io,
                          lightning.TrainguardCheckpointIO)
    callbacks = trainer.callbacks  # type: ignore[attr-defined]
    assert sum(isinstance(cb, lightning.TrainguardCallback) for cb in callbacks) == 1


def test_without_a_dirpath_every_logger_versions_checkpoints_are_searched(
        tmp_path: Path) -> None:
    from pytorch_lightning import Trainer
    from pytorch_lightning.callbacks import ModelCheckpoint

    from trainguard.integrations import lightning

    # each attempt logs to a new version_N: the commit of attempt 0 is in version_0
    ckpt_file(tmp_path / "lightning_logs/version_0/checkpoints", 4, marked=True)
    ckpt_file(tmp_path / "lightning_logs/version_1/checkpoints", 1006, whole=False)
    trainer = Trainer(accelerator="cpu", devices=1, callbacks=[ModelCheckpoint()],
                      default_root_dir=tmp_path, enable_progress_bar=False)
    assert lightning.resume_path(trainer) == str(
        tmp_path / "lightning_logs/version_0/checkpoints/epoch=0-step=4.ckpt")
    pinned = Trainer(accelerator="cpu", devices=1, default_root_dir=tmp_path,
                     callbacks=[ModelCheckpoint(dirpath=tmp_path / "elsewhere")])
    assert lightning.checkpoint_dirs(pinned) == [tmp_path / "elsewhere"]
    assert lightning.resume_path(pinned) is None


def test_a_commit_tells_the_launcher_the_absolute_path_of_a_relative_output_dir(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as launcher:
        launcher.bind(str(tmp_path / "s"))
        monkeypatch.setenv(ENV_SOCKET, str(tmp_path / "s"))
        monkeypatch.chdir(tmp_path)  # HF's output_dir="runs/hfd", relative to the cwd
        d = ckpt(Path("runs/hfd"), 10)
        mark_committed(d, 10)
        mark_file_committed(ckpt_file(Path("runs/pl"), 8), 8)
        got = [json.loads(launcher.recv(65536))["location"] for _ in range(2)]
    assert got == [str(tmp_path / "runs/hfd/checkpoint-10"),
                   str(tmp_path / "runs/pl/epoch=0-step=8.ckpt")]


def test_the_same_lightning_file_saved_twice_at_one_step_is_one_commit_told(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """(walk-through 22) A drain at a regular checkpoint step: the drain's save, then
    ModelCheckpoint's, wrote epoch=1-step=16.ckpt twice and the job had two CheckpointSaved
    events for it. The second write is committed again (its file is the one on disk) but
    not told; a later step is."""
    from trainguard.integrations.lightning import TrainguardCheckpointIO

    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as launcher:
        launcher.bind(str(tmp_path / "s"))
        launcher.settimeout(0.5)
        monkeypatch.setenv(ENV_SOCKET, str(tmp_path / "s"))
        io = TrainguardCheckpointIO()
        f = tmp_path / "epoch=1-step=16.ckpt"
        io.on_exit = "drained"
        io.save_checkpoint({"global_step": 16, "state_dict": {}}, f)
        io.save_checkpoint({"global_step": 16, "state_dict": {"w": 1}}, f)
        io.save_checkpoint({"global_step": 20, "state_dict": {}}, tmp_path / "s20.ckpt")
        got = []
        with contextlib.suppress(TimeoutError):
            while True:
                got.append(json.loads(launcher.recv(65536)))
    assert [(m["step"], m["on_exit"]) for m in got] == [(16, "drained"), (20, None)]
    assert file_committed_step(f) == 16


def test_a_step_saved_again_under_another_name_is_committed_but_told_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """(walk-through 29, #3) ModelCheckpoint(save_last=True) writes epoch=E-step=S.ckpt and
    then last.ckpt: both committed, one CheckpointSaved per step."""
    from trainguard.integrations.lightning import TrainguardCheckpointIO

    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as launcher:
        launcher.bind(str(tmp_path / "s"))
        launcher.settimeout(0.5)
        monkeypatch.setenv(ENV_SOCKET, str(tmp_path / "s"))
        io = TrainguardCheckpointIO()
        for step in (4, 8):
            io.save_checkpoint({"global_step": step}, tmp_path / f"epoch=0-step={step}.ckpt")
            io.save_checkpoint({"global_step": step}, tmp_path / "last.ckpt")
        io.told_step = None  # a new fit (TrainguardCallback.on_train_start)
        io.save_checkpoint({"global_step": 8}, tmp_path / "last.ckpt")
        got = []
        with contextlib.suppress(TimeoutError):
            while True:
                got.append(json.loads(launcher.recv(65536)))
    assert [(m["step"], Path(m["location"]).name) for m in got] == [
        (4, "epoch=0-step=4.ckpt"), (8, "epoch=0-step=8.ckpt"), (8, "last.ckpt")]
    assert file_committed_step(tmp_path / "last.ckpt") == 8


def test_the_lightning_loss_reported_is_the_one_training_step_returned(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """(walk-through 29, #2) Automatic optimization hands the callbacks the returned loss
    divided by accumulate_grad_batches (multiplied back); manual optimization the loss
    itself (kept)."""
    from types import SimpleNamespace

    from trainguard.integrations import lightning

    sent: list[tuple[int, float | None]] = []
    monkeypatch.setattr(lightning, "log_metrics",
                        lambda step, loss=None, learning_rate=None: sent.append((step, loss)))
    trainer = SimpleNamespace(accumulate_grad_batches=4, optimizers=[])
    cb = lightning.TrainguardCallback()
    cb._log_metrics(trainer, SimpleNamespace(automatic_optimization=True), 3,  # type: ignore[arg-type]
                    {"loss": 0.375})
    cb._log_metrics(trainer, SimpleNamespace(automatic_optimization=False), 4,  # type: ignore[arg-type]
                    {"loss": 1.5})
    cb._log_metrics(trainer, SimpleNamespace(automatic_optimization=True), 5,  # type: ignore[arg-type]
                    None)
    assert sent == [(3, 1.5), (4, 1.5), (5, None)]


def test_a_mid_epoch_lightning_resume_with_a_plain_dataloader_says_it_is_not_exact(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """(walk-through 22) Only Lightning's own warning hinted that a plain DataLoader resumed
    inside an epoch draws that epoch from its start again; trainguard says so with the fix.
    A real Trainer, in this process: 3 steps saved mid-epoch (10 batches an epoch), then a
    second fit resumes from that committed checkpoint."""
    import pytorch_lightning as pl
    import torch
    from pytorch_lightning.callbacks import ModelCheckpoint
    from torch.utils.data import DataLoader, TensorDataset

    from trainguard.integrations import lightning

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(2, 1)

        def training_step(self, batch: Any, _: int) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.mse_loss(self.lin(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(20, 2), torch.randn(20, 1)), batch_size=2)

    def trainer(steps: int) -> pl.Trainer:
        return pl.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False,
                          enable_progress_bar=False, enable_model_summary=False,
                          default_root_dir=tmp_path, callbacks=[ModelCheckpoint(
                              dirpath=tmp_path / "ck", every_n_train_steps=3, save_top_k=-1)])

    from trainguard.node.channel import ChannelServer
    from trainguard.worker.contract import ENV_RANK, ENV_SOCKET, MessageKind

    srv = ChannelServer(f"@tg-test-{tmp_path.name}-lightning-exact")
    monkeypatch.setenv(ENV_SOCKET, srv.name)
    monkeypatch.setenv(ENV_RANK, "0")
    lightning.fit(trainer(3), Tiny(), data)
    assert "keeps no position" not in capsys.readouterr().err  # a fresh start says nothing
    lightning.fit(trainer(5), Tiny(), data)
    err = capsys.readouterr().err
    # (walk-through 25) said to the launcher too: a Warning event, not only the rank's log
    said = [m for m in srv.drain() if m["kind"] == MessageKind.RESUMED and "not_exact" in m]
    srv.close()
    assert len(said) == 1 and said[0]["not_exact"].startswith(
        "resumed after batch 3 of epoch 0 with a DataLoader that keeps no position"), said
    assert ("lightning: resumed after batch 3 of epoch 0 with a DataLoader that keeps no "
            "position: the rest of this epoch is drawn from its start again, not exact; a "
            "torchdata StatefulDataLoader resumes where it stopped") in err, err


def test_auto_resume_of_the_other_framework_says_so_once_when_its_trainer_runs(
        tmp_path: Path) -> None:
    """Walk-through 25: `--auto-resume hf` on a Lightning script (and the reverse) resumed
    nothing and said nothing; the job trained again from step 0. Review 48 #2: said when the
    other framework's Trainer runs, not when its module is imported (an HF script importing
    Lightning's seed_everything was told nothing resumes it). A real interpreter under the
    site hook, as `trainguard run --auto-resume hf` starts a rank."""
    import subprocess
    import sys

    from trainguard.integrations.autoresume import site_dir
    from trainguard.worker.contract import ENV_AUTO_RESUME

    script = tmp_path / "both.py"
    script.write_text(
        "import sys\n"
        "from pytorch_lightning import seed_everything\n"
        "seed_everything(0)\n"
        "print('imported', file=sys.stderr, flush=True)\n"
        "import pytorch_lightning as pl\n"
        "for _ in range(2):\n"
        "    try:\n"
        "        pl.Trainer.fit(None)  # the script runs Lightning's Trainer (none: it raises)\n"
        "    except Exception:\n"
        "        pass\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [site_dir(), *filter(None, [os.environ.get("PYTHONPATH")])]), ENV_AUTO_RESUME: "hf"}
    r = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    said = [line for line in r.stderr.splitlines() if "--auto-resume hf is on" in line]
    assert r.stderr.index("imported") < r.stderr.index("--auto-resume hf is on"), r.stderr
    assert said == ["[trainguard] --auto-resume hf is on, but this script trains with "
                    "Lightning's Trainer (pytorch_lightning.trainer.trainer.Trainer.fit), which "
                    "it does not patch: nothing resumes it from a checkpoint. Fix: run with "
                    "--auto-resume lightning"], r.stderr[-2000:]


class _Phase:
    """trainguard.phase's stand-in: records each mark (name, allowance) instead of sending."""

    marks: list[tuple[str, str, float | None]] = []

    def __init__(self, name: str, timeout_s: float | None = None) -> None:
        self.name, self.timeout_s = name, timeout_s

    def __enter__(self) -> None:
        _Phase.marks.append(("begin", self.name, self.timeout_s))

    def __exit__(self, *exc: object) -> None:
        _Phase.marks.append(("end", self.name, self.timeout_s))


@pytest.fixture
def phases(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, float | None]]:
    """The marks the integrations make, each batch renewing at once (RENEW_S 0), with a
    7 s per-batch allowance from the environment."""
    from trainguard.integrations import marked
    from trainguard.worker.contract import ENV_EVAL_BATCH_S

    monkeypatch.setattr(marked, "phase", _Phase)
    monkeypatch.setattr(marked, "RENEW_S", 0.0)
    monkeypatch.setenv(ENV_EVAL_BATCH_S, "7")
    _Phase.marks = []
    return _Phase.marks


def test_lightning_marks_validation_sanity_check_test_and_predict_renewed_each_batch(
        phases: list[tuple[str, str, float | None]]) -> None:
    """Review 47 #1: validation reports no step; after a short first epoch of fast steps
    (an 8 s threshold) a longer validation was confirmed hung, and with --restart-on-hang a
    healthy job failed. Each validation and sanity check is a phase. Review 48 #1: an
    unbounded phase waited 30 minutes for a batch that never returned: each batch renews it
    with the per-batch allowance; #3: test and predict are marked too."""
    from types import SimpleNamespace

    from trainguard.integrations import lightning

    cb = lightning.TrainguardCallback()
    trainer: Any = SimpleNamespace(sanity_checking=True)
    cb.on_sanity_check_start(trainer, None)
    cb.on_validation_start(trainer, None)  # Lightning calls it inside the sanity check too
    cb.on_validation_batch_end(trainer, None, None, None, 0)
    cb.on_validation_end(trainer, None)
    cb.on_sanity_check_end(trainer, None)
    trainer.sanity_checking = False
    cb.on_validation_start(trainer, None)
    cb.on_validation_batch_end(trainer, None, None, None, 0)
    cb.on_exception(trainer, None, RuntimeError("boom"))  # a validation that raised
    cb.on_validation_end(trainer, None)  # (not called then; harmless if it is)
    cb.on_test_start(trainer, None)
    cb.on_test_batch_end(trainer, None, None, None, 0)
    cb.on_test_end(trainer, None)
    cb.on_predict_start(trainer, None)
    cb.on_predict_end(trainer, None)
    assert phases == [(edge, name, 7.0) for name, edges in (
        ("sanity check", ["begin", "end", "begin", "end"]),
        ("validation", ["begin", "end", "begin", "end"]),
        ("test", ["begin", "end", "begin", "end"]),
        ("prediction", ["begin", "end"])) for edge in edges]


def test_an_hf_evaluation_and_prediction_are_phases_renewed_each_batch(
        monkeypatch: pytest.MonkeyPatch, phases: list[tuple[str, str, float | None]]) -> None:
    """Review 47 #1's HF twin: Trainer.evaluate between steps reports no step either; review
    48 #1 #3: each prediction step renews it, and Trainer.predict is marked too."""
    from transformers import Trainer

    from trainguard.integrations import hf

    cb = hf.TrainguardCallback()

    def work(self: Any, *a: Any, **k: Any) -> dict[str, float]:
        phases.append(("work", "", None))
        cb.on_prediction_step(None, None, None)  # Trainer's callback after each batch
        return {"eval_loss": 1.0}

    monkeypatch.setattr(Trainer, "evaluate", work)
    monkeypatch.setattr(Trainer, "predict", work)
    hf.patch_evaluate()
    hf.patch_evaluate()  # idempotent: one phase, not two
    assert Trainer.evaluate(object()) == {"eval_loss": 1.0}  # type: ignore[arg-type]
    with pytest.raises(ZeroDivisionError):  # a prediction that raises ends its phase
        monkeypatch.setattr(Trainer, "predict", lambda self: 1 / 0)
        hf.patch_evaluate()
        Trainer.predict(object())  # type: ignore[arg-type]
    assert phases == [("begin", "evaluation", 7.0), ("work", "", None),
                      ("end", "evaluation", 7.0), ("begin", "evaluation", 7.0),
                      ("end", "evaluation", 7.0),
                      ("begin", "prediction", 7.0), ("end", "prediction", 7.0)]
