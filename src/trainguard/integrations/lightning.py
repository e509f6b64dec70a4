"""PyTorch Lightning: progress, committed checkpoints, a resume that cannot pick a
half-written one, and Lightning's own Slurm requeue out of trainguard's way.

    from trainguard.integrations.lightning import fit
    fit(trainer, model)   # resumes from the newest committed .ckpt, or starts fresh

`fit` adds TrainguardCallback (the global step as progress), wraps the strategy's
CheckpointIO in TrainguardCheckpointIO (each .ckpt file is committed, with a sidecar marker
`<name>.ckpt.trainguard-committed`, once its write has returned: a callback's
`on_save_checkpoint` runs before the write), and passes `ckpt_path=` the newest committed
checkpoint of the trainer's ModelCheckpoint directories. `patch()` does the same inside
`Trainer.fit` for unmodified scripts (`trainguard run --auto-resume lightning`).

The commit happens where the file is written: on global rank 0, for strategies that write
through the CheckpointIO plugin (single device, DDP, FSDP with a full state dict).
Strategies that write sharded checkpoints themselves (DeepSpeed, FSDP sharded) and
AsyncCheckpointIO (its save returns before the write) are not committed. The callback also
puts rank 0's loss and learning rate in the job's metrics at the steps Lightning logs, and
drains on request (integrations.drain): a checkpoint at the next optimizer step the ranks
agree on, `trainer.should_stop`, then an exit at train end.

A resumed fit sets each train loader's sampler epoch before Lightning gives the loaders their
saved state (`sampler_epoch_first`): torchdata's StatefulDataLoader fixes a
DistributedSampler's order when its state is loaded, and Lightning sets the epoch only after.
"""

from __future__ import annotations

import re
import time
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pytorch_lightning.callbacks import Callback, ModelCheckpoint
from pytorch_lightning.plugins.environments import (  # type: ignore[attr-defined]
    SLURMEnvironment,
)
from pytorch_lightning.plugins.io import AsyncCheckpointIO, CheckpointIO, TorchCheckpointIO
from pytorch_lightning.trainer.trainer import Trainer
from pytorch_lightning.utilities.exceptions import SIGTERMException

from trainguard.integrations.common import (
    checkpoint_files,
    checkpoints_under,
    log,
    mark_file_committed,
    newest_file,
    resumed,
    unmark_file,
)
from trainguard.integrations.drain import EXIT_CODE, Drain
from trainguard.integrations.lightning_loaders import sampler_epoch_first
from trainguard.integrations.marked import RenewedPhase
from trainguard.worker import channel
from trainguard.worker.progress import log_metrics, progress

SUFFIX = ".ckpt"
STEP_IN_NAME = re.compile(r"step=(\d+)")  # ModelCheckpoint's default name: epoch=E-step=S


def complete(ckpt_file: Path) -> int | None:
    """For a .ckpt saved before trainguard ran the job: its step (from the name) when the
    file is a whole torch.save zip (its central directory, written last, is there)."""
    m = STEP_IN_NAME.search(ckpt_file.name)
    try:
        return int(m.group(1)) if m and zipfile.is_zipfile(ckpt_file) else None
    except OSError:
        return None


def newest_committed(dirs: Iterable[str | Path]) -> tuple[int, Path] | None:
    files = [f for d in dirs for f in checkpoint_files(Path(d), SUFFIX)]
    return newest_file(files, complete)


def last_checkpoint(dirpath: str | Path | None) -> str | None:
    """The newest committed .ckpt in `dirpath` (the highest step), or None; the launcher
    hears which (its recover record's resume point and source)."""
    if dirpath is None:
        return None
    return _resume_from(newest_committed([dirpath]))


def _resume_from(found: tuple[int, Path] | None) -> str | None:
    if found is None:
        return None
    resumed(found[1], found[0])
    return str(found[1])


def checkpoint_dirs(trainer: Trainer) -> list[Path]:
    """Where the trainer's ModelCheckpoint callbacks save: their `dirpath`, or (not set: it
    depends on the logger's version, new on each attempt) every `checkpoints` directory a
    few levels under the trainer's default_root_dir (common.checkpoints_under)."""
    dirs: list[Path] = []
    unset = False
    for cb in trainer.callbacks:  # type: ignore[attr-defined]
        if isinstance(cb, ModelCheckpoint):
            if cb.dirpath:
                dirs.append(Path(cb.dirpath))
            else:
                unset = True
    if unset or not dirs:
        dirs.extend(checkpoints_under(Path(trainer.default_root_dir)))
    return dirs


def resume_path(trainer: Trainer) -> str | None:
    """The newest committed checkpoint of the trainer's checkpoint directories, or None."""
    return _resume_from(newest_committed(checkpoint_dirs(trainer)))


class TrainguardCallback(Callback):
    """Reports the global step (optimizer steps, across epochs and restarts) as progress, and
    rank 0's loss and learning rate as metrics; drains when trainguard asks."""

    def __init__(self) -> None:
        self.drain = Drain()
        self._last_step: int | None = None
        self._marked = RenewedPhase()  # a validation, sanity check, test or prediction

    # they report no step: a phase of its own each, renewed at each batch (marked.py), or a
    # short first epoch followed by a long validation read as a hang (review 47 #1: the fast
    # steps taught an 8 s threshold), and a batch that never returns waited 30 minutes
    # (review 48 #1); test and predict too (review 48 #3)
    def on_sanity_check_start(self, trainer: Trainer, pl_module: Any) -> None:
        self._marked.begin("sanity check")

    def on_sanity_check_end(self, trainer: Trainer, pl_module: Any) -> None:
        self._marked.end()

    def on_validation_start(self, trainer: Trainer, pl_module: Any) -> None:
        if not trainer.sanity_checking:
            self._marked.begin("validation")

    def on_validation_end(self, trainer: Trainer, pl_module: Any) -> None:
        if not trainer.sanity_checking:
            self._marked.end()

    def on_validation_batch_end(self, *args: Any, **kwargs: Any) -> None:
        self._marked.batch()

    on_test_batch_end = on_predict_batch_end = on_validation_batch_end

    def on_test_start(self, trainer: Trainer, pl_module: Any) -> None:
        self._marked.begin("test")

    def on_predict_start(self, trainer: Trainer, pl_module: Any) -> None:
        self._marked.begin("prediction")

    def on_test_end(self, trainer: Trainer, pl_module: Any) -> None:
        self._marked.end()

    on_predict_end = on_test_end

    def on_exception(self, trainer: Trainer, pl_module: Any, exception: BaseException) -> None:
        self._marked.end(exception)

    def on_train_start(self, trainer: Trainer, pl_module: Any) -> None:
        self.drain.start()
        io = trainer.strategy.checkpoint_io
        if isinstance(io, TrainguardCheckpointIO):  # a new fit: its saves are all told anew
            io.told_step = None

    def on_train_batch_end(self, trainer: Trainer, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step = int(trainer.global_step)
        progress(step)
        if step == self._last_step:  # accumulating gradients: no optimizer step yet
            return
        self._last_step = step
        every = int(getattr(trainer, "log_every_n_steps", 50) or 0)  # 0: Lightning never logs
        if trainer.is_global_zero and every > 0 and step % every == 0:
            self._log_metrics(trainer, pl_module, step, outputs)
        if self.drain.drained_at is not None:  # min_steps/min_epochs kept it going
            self.drain.finish()
        if self.drain.step_end():
            self._save_and_stop(trainer, step)

    def _log_metrics(self, trainer: Trainer, pl_module: Any, step: int, outputs: Any) -> None:
        """The loss training_step returned (this rank's) and the first optimizer's rate.
        Under automatic optimization Lightning hands the callbacks its closure loss, the
        returned one divided by accumulate_grad_batches (ClosureResult): multiplied back.
        Manual optimization's is the returned loss itself."""
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        optimizers = trainer.optimizers
        lr = optimizers[0].param_groups[0].get("lr") if optimizers else None
        value = None if loss is None else float(loss)
        if value is not None and getattr(pl_module, "automatic_optimization", True):
            value *= int(getattr(trainer, "accumulate_grad_batches", 1) or 1)
        log_metrics(step, loss=value, learning_rate=lr)

    def _save_and_stop(self, trainer: Trainer, step: int) -> None:
        """Every rank: the drain checkpoint (committed by TrainguardCheckpointIO once written),
        where the trainer's ModelCheckpoint saves, then stop."""
        dirs = [Path(cb.dirpath) for cb in trainer.callbacks  # type: ignore[attr-defined]
                if isinstance(cb, ModelCheckpoint) and cb.dirpath]
        where = dirs[0] if dirs else Path(trainer.default_root_dir) / "checkpoints"
        io = trainer.strategy.checkpoint_io
        if isinstance(io, TrainguardCheckpointIO):
            io.on_exit = self.drain.on_exit()
        trainer.save_checkpoint(where / f"epoch={trainer.current_epoch}-step={step}{SUFFIX}")
        self.drain.drained_at = step
        trainer.should_stop = True

    def on_train_end(self, trainer: Trainer, pl_module: Any) -> None:
        self.drain.finish()


class TrainguardCheckpointIO(CheckpointIO):
    """Wraps a CheckpointIO (the strategy's; TorchCheckpointIO when none): each local .ckpt
    is committed once `save_checkpoint` returned, and unmarked before it is overwritten or
    removed. One save is told per step: the same step written again, under its own name or
    another (ModelCheckpoint's last.ckpt with save_last=True, a second ModelCheckpoint), is
    committed (resume may pick that file) but not told, so the job counts one save."""

    def __init__(self, checkpoint_io: CheckpointIO | None = None) -> None:
        self.checkpoint_io = checkpoint_io if checkpoint_io is not None else TorchCheckpointIO()
        self.on_exit: str | None = None  # set for a drain's save: the next commit says why
        self.told_step: int | None = None  # the step of the last commit told (this fit)

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any,
                        storage_options: Any | None = None) -> None:
        local = "://" not in str(path)
        if local:
            unmark_file(Path(path))
        started = time.monotonic()
        self.checkpoint_io.save_checkpoint(checkpoint, path, storage_options=storage_options)
        if local and Path(path).is_file():  # written in the loop: it waited for the write
            took, step = time.monotonic() - started, int(checkpoint.get("global_step", 0))
            # a step told already (ModelCheckpoint's epoch=E-step=S.ckpt, then its last.ckpt;
            # a drain's save, then ModelCheckpoint's at its regular step): committed again,
            # told once, or the interval would be the ms between the two writes; a drain's is
            # always told (the job must hear that the ranks saved on their way out)
            again = self.told_step == step and self.on_exit is None
            mark_file_committed(Path(path), step, write_s=took, blocked_s=took,
                                on_exit=self.on_exit, tell=not again)
            self.told_step = step
            self.on_exit = None

    def load_checkpoint(self, path: Any, map_location: Any | None = None,
                        weights_only: bool | None = None) -> dict[str, Any]:
        loaded: dict[str, Any] = self.checkpoint_io.load_checkpoint(
            path, map_location=map_location, weights_only=weights_only)
        return loaded

    def remove_checkpoint(self, path: Any) -> None:
        if "://" not in str(path):
            unmark_file(Path(path))
        self.checkpoint_io.remove_checkpoint(path)

    def teardown(self) -> None:
        self.checkpoint_io.teardown()


def prepare(trainer: Trainer) -> None:
    """Add the callback, wrap the checkpoint IO, set the samplers' epoch before a resumed
    loader state is loaded, and (launched by trainguard) switch off Lightning's Slurm
    auto-requeue. Idempotent."""
    if not any(isinstance(cb, TrainguardCallback) for cb in trainer.callbacks):  # type: ignore[attr-defined]
        trainer.callbacks.append(TrainguardCallback())  # type: ignore[attr-defined]
    strategy = trainer.strategy
    io = strategy.checkpoint_io
    if isinstance(io, AsyncCheckpointIO):
        log("lightning: AsyncCheckpointIO returns before the file is written: "
            "its checkpoints are not committed")
    elif not isinstance(io, TrainguardCheckpointIO):
        strategy.checkpoint_io = TrainguardCheckpointIO(io)
    sampler_epoch_first(trainer)
    # what the signal connector reads when fit() registers its handlers
    env = getattr(trainer._accelerator_connector, "cluster_environment", None)
    if isinstance(env, SLURMEnvironment) and env.auto_requeue and channel.available():
        env.auto_requeue = False
        log("lightning: switched off Lightning's Slurm auto-requeue (save on SIGUSR1, "
            "then `scontrol requeue`): trainguard restarts this job")


def fit(trainer: Trainer, model: Any, train_dataloaders: Any = None,
        val_dataloaders: Any = None, datamodule: Any = None, **kwargs: Any) -> Any:
    """`trainer.fit(model, ...)` resuming from the newest committed checkpoint (or from
    scratch); the other arguments are passed on (not ckpt_path: that is trainguard's pick)."""
    prepare(trainer)
    return _exits_143_on_sigterm(lambda: trainer.fit(
        model, train_dataloaders, val_dataloaders, datamodule, ckpt_path=resume_path(trainer),
        **kwargs))


def _exits_143_on_sigterm(run: Callable[[], Any]) -> Any:
    """Lightning turns a SIGTERM into SIGTERMException, a SystemExit without a code: the
    rank exited 0, and a job stopped from outside at step 8 of 24 read succeeded (or, rank 1
    first, a script that ran too few steps; walk-through 39 #1). The rank exits as one
    stopped by SIGTERM, 143, as a drained one does: trainguard restarts it."""
    try:
        return run()
    except SIGTERMException as e:
        log("lightning: stopped by SIGTERM (Lightning's SIGTERMException): exit "
            f"{EXIT_CODE}, not 0")
        raise SystemExit(EXIT_CODE) from e


def patch() -> None:
    """Make `Trainer.fit` resume by itself (the `--auto-resume lightning` site hook): an
    absent or "last" ckpt_path becomes the newest committed checkpoint, or None."""
    original = Trainer.fit
    if getattr(original, "__trainguard__", False):
        return

    def fit_resuming(self: Trainer, model: Any, train_dataloaders: Any = None,
                     val_dataloaders: Any = None, datamodule: Any = None,
                     ckpt_path: Any = None, *args: Any, **kwargs: Any) -> Any:
        prepare(self)
        if ckpt_path is None or ckpt_path == "last":
            ckpt_path = resume_path(self)
            what = ckpt_path or "no committed checkpoint yet: starting fresh"
            print(f"[trainguard] auto-resume: {what}", flush=True)
        return _exits_143_on_sigterm(lambda: original(
            self, model, train_dataloaders, val_dataloaders, datamodule, ckpt_path, *args,
            **kwargs))

    fit_resuming.__trainguard__ = True  # type: ignore[attr-defined]
    fit_resuming.__wrapped__ = original  # type: ignore[attr-defined]
    Trainer.fit = fit_resuming  # type: ignore[method-assign]
