"""A PyTorch Lightning job, tiny and CPU-only (a 2-layer MLP on random data, 2 ranks DDP over
gloo), for trainguard's Lightning integration.

    # unmodified: trainguard's site hook makes Trainer.fit() resume
    trainguard run --auto-resume lightning --nproc-per-node 2 --max-restarts 3 \
        examples/lightning_trainer.py --out runs/pl
    # one line changed: fit() from trainguard.integrations.lightning
    trainguard run --nproc-per-node 2 --max-restarts 3 examples/lightning_trainer.py \
        --out runs/pl --trainguard

(--max-restarts: trainguard restarts nothing without a restart budget, as torchrun;
--scenario single-node sets one too.)

Lightning reads the ranks from the torchrun variables trainguard sets (its
TorchElasticEnvironment). Deterministic: the seed is set before the model is built and the
model has no dropout. Exact mid-epoch resume needs a *resumable* loader: Lightning stores the
loader's `state_dict()` in the checkpoint and gives it back before iterating (Lightning PR
#19475); a plain DataLoader restarts the interrupted epoch from its first batch (Lightning
warns "not resumable"). ResumableLoader below is the smallest such loader (torchdata's
StatefulDataLoader is another).

At the end rank 0 prints `losses [[step, loss], ...]` (rank 0's loss at every step, kept in
the checkpoint: the whole run's, across restarts) and `weights sha256 HEX`. For the tests,
EXAMPLE_KILL_AT=STEP makes rank 1 SIGKILL itself after that step on the first attempt
(EXAMPLE_LEFTOVER=1: after leaving a half-written newer .ckpt behind, as a kill during a
save on a non-atomic filesystem would); EXAMPLE_PLAIN_LOADER=1 uses a plain DataLoader,
EXAMPLE_STATEFUL_LOADER=1 torchdata's StatefulDataLoader (the same batches as ResumableLoader:
Lightning gives both the same DistributedSampler);
EXAMPLE_ACCUMULATE=N sets accumulate_grad_batches=N; EXAMPLE_SAVE_LAST=1 passes save_last=True
to the ModelCheckpoint (a last.ckpt written at every save too);
EXAMPLE_STOP_AT=STEP makes rank 0 run `trainguard stop` on its own job when it first reaches
that step (once per output dir) and then slows every step to 1 s, so the drain lands mid-run.
Like the other examples it honours TRAINGUARD_FAULT (trainguard.testing.faults, fired after
each optimizer step: `signal:KILL@step=13,rank=1` and `hang@step=8` with --restart-on-hang
are restarted; `exit:3@rank=1,step=5` is an exit the script chose, restarted only with
--unconditional-restart).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset

from trainguard.testing.faults import inject

FEATURES = 16


class ResumableLoader(DataLoader):  # type: ignore[type-arg]
    """A DataLoader with `state_dict`/`load_state_dict`: how many batches of the current
    epoch were handed out; a loaded state skips those (the sampler's order is the same:
    Lightning sets the DistributedSampler's epoch before the first batch is drawn)."""

    _skip = 0
    _given = 0

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        skip, self._skip = self._skip, 0
        if skip >= len(self):  # saved at the epoch's last batch: the next epoch starts anew
            skip = 0
        return self._batches(skip)

    def _batches(self, skip: int) -> Iterator[Any]:
        self._given = skip
        it = super().__iter__()
        for _ in range(skip):
            next(it)
        for batch in it:
            self._given += 1
            yield batch

    def state_dict(self) -> dict[str, int]:
        return {"batches": self._given}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._skip = int(state["batches"])


class Regressor(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.Tanh(),
                                       torch.nn.Linear(32, 1))
        self.losses: list[list[float]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.losses.append([self.global_step + 1, float(loss.detach())])
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-2)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["example_losses"] = self.losses

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.losses = checkpoint["example_losses"]


class Faults(pl.Callback):
    """TRAINGUARD_FAULT (trainguard.testing.faults), after each optimizer step: a no-op
    without it (walk-through 35 F6: this example ignored it, and a job "survived" a kill it
    never had). A step is reported once, however many batches it accumulates."""

    def __init__(self) -> None:
        self.last: int | None = None

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step != self.last:
            self.last = trainer.global_step
            inject(trainer.global_step)


class KillAt(pl.Callback):
    """The tests' fault: rank 1 SIGKILLs itself after step N of the first attempt."""

    def __init__(self, step: int, out: Path, leftover: bool) -> None:
        self.step, self.out, self.leftover = step, out, leftover

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        first = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        if trainer.global_step == self.step and first and trainer.global_rank == 1:
            if self.leftover:  # a save cut short: the start of a file, no zip directory
                bad = self.out / f"epoch=0-step={self.step + 1000}.ckpt"
                bad.write_bytes(b"PK\x03\x04" + b"\0" * 1000)
            os.kill(os.getpid(), signal.SIGKILL)


class StopAt(pl.Callback):
    """The tests' stop: rank 0 runs `trainguard stop` on its job after step N, as a user
    would (once: a file in the output dir remembers it), then sleeps 1 s per step until the
    drain stops the job."""

    def __init__(self, step: int, out: Path) -> None:
        self.step, self.done, self.stopping = step, out / "example-stopped", False

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step and trainer.global_rank == 0 \
                and not self.done.exists():
            self.done.parent.mkdir(parents=True, exist_ok=True)
            self.done.touch()
            self.stopping = True
            subprocess.Popen([sys.executable, "-m", "trainguard", "stop",
                              os.environ["TRAINGUARD_JOB_DIR"]], stdout=subprocess.DEVNULL)
        if self.stopping:
            time.sleep(1.0)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, help="the checkpoint directory")
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--save-every", type=int, default=5)
    p.add_argument("--samples", type=int, default=160, help="per epoch, all ranks")
    p.add_argument("--trainguard", action="store_true",
                   help="use trainguard.integrations.lightning (else plain Trainer.fit())")
    a = p.parse_args()
    out = Path(a.out)
    pl.seed_everything(7, workers=True)  # the model's initial weights too
    model = Regressor()
    g = torch.Generator().manual_seed(11)
    x = torch.randn(a.samples, FEATURES, generator=g)
    data = TensorDataset(x, x.sum(dim=1, keepdim=True).sin())
    loader_cls: Any = DataLoader if os.environ.get("EXAMPLE_PLAIN_LOADER") == "1" \
        else ResumableLoader
    if os.environ.get("EXAMPLE_STATEFUL_LOADER") == "1":
        from torchdata.stateful_dataloader import StatefulDataLoader

        loader_cls = StatefulDataLoader
    loader = loader_cls(data, batch_size=8, shuffle=True, num_workers=0)
    callbacks: list[pl.Callback] = [ModelCheckpoint(
        dirpath=out, every_n_train_steps=a.save_every, save_top_k=-1,
        save_last=os.environ.get("EXAMPLE_SAVE_LAST") == "1"), Faults()]
    kill = os.environ.get("EXAMPLE_KILL_AT")
    if kill:
        callbacks.append(KillAt(int(kill), out, os.environ.get("EXAMPLE_LEFTOVER") == "1"))
    if os.environ.get("EXAMPLE_STOP_AT"):
        callbacks.append(StopAt(int(os.environ["EXAMPLE_STOP_AT"]), out))
    trainer = pl.Trainer(
        accelerator="cpu", devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        num_nodes=int(os.environ.get("WORLD_SIZE", "1"))
        // int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        strategy=DDPStrategy(process_group_backend="gloo"), max_steps=a.steps,
        accumulate_grad_batches=int(os.environ.get("EXAMPLE_ACCUMULATE", "1")),
        deterministic=True, callbacks=callbacks, logger=False, enable_progress_bar=False,
        log_every_n_steps=1,  # what trainguard's callback reports as metrics, too
        enable_model_summary=False, default_root_dir=out, num_sanity_val_steps=0)
    if a.trainguard:
        from trainguard.integrations.lightning import fit

        fit(trainer, model, loader)
    else:
        trainer.fit(model, loader)
    if trainer.is_global_zero:
        print("losses " + json.dumps(model.losses), flush=True)
        digest = hashlib.sha256()
        for name, t in sorted(model.state_dict().items()):
            digest.update(name.encode())
            digest.update(t.detach().cpu().contiguous().numpy().tobytes())
        print(f"weights sha256 {digest.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
