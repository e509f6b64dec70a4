"""A Hugging Face Trainer job, tiny and CPU-only (a 2-layer GPT-2 built from a config, random
tokens: no hub download), for trainguard's HF integration.

    # unmodified: trainguard's site hook makes Trainer.train() resume
    trainguard run --auto-resume hf --nproc-per-node 2 --max-restarts 3 \
        examples/hf_trainer.py --out runs/hf
    # one line changed: the callback and train() from trainguard.integrations.hf
    trainguard run --nproc-per-node 2 --max-restarts 3 examples/hf_trainer.py --out runs/hf \
        --trainguard

(--max-restarts: trainguard restarts nothing without a restart budget, as torchrun;
--scenario single-node sets one too.)

At the end rank 0 prints `losses [[step, loss], ...]` (the trainer's log history: the whole
run's, across restarts), `weights sha256 HEX` and the keys of train()'s metrics; every rank
prints whether its Trainer state says it is the world's process zero. For the tests,
EXAMPLE_KILL_AT=STEP makes rank 1 SIGKILL itself after that step on the first attempt
(EXAMPLE_LEFTOVER=1: after leaving a half-written checkpoint directory behind, as a kill
during a save would);
EXAMPLE_KILL_IN_SAVE=STEP makes rank 1 SIGKILL itself inside checkpoint-STEP's save (before
its RNG state is written) on the first attempt; EXAMPLE_STOP_AT=STEP
makes rank 0 run `trainguard stop` on its own job when it first reaches that step (once per
output dir) and then slows every step to 1 s, so the drain lands mid-run. Like the other
examples it honours TRAINGUARD_FAULT (trainguard.testing.faults, fired after each optimizer
step: `signal:KILL@rank=1,step=12` and `hang@step=8` with --restart-on-hang are restarted;
`exit:3@rank=1,step=5` is an exit the script chose, restarted only with
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
from pathlib import Path
from typing import Any

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    set_seed,
)

from trainguard.testing.faults import inject

VOCAB, SEQ = 128, 32


class RandomTokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.data = torch.randint(0, VOCAB, (n, SEQ), generator=g)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.data[i], "labels": self.data[i]}


class Faults(TrainerCallback):
    """TRAINGUARD_FAULT (trainguard.testing.faults), after each step: a no-op without it."""

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        inject(state.global_step)


class KillAt(TrainerCallback):
    """The tests' fault: rank 1 SIGKILLs itself after step N of the first attempt."""

    def __init__(self, step: int, leftover: bool) -> None:
        self.step, self.leftover = step, leftover

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        first = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        if state.global_step == self.step and first and os.environ.get("RANK") == "1":
            if self.leftover:  # a save cut short: no trainer_state.json, half a model file
                d = Path(args.output_dir) / f"checkpoint-{self.step + 1000}"
                d.mkdir(parents=True, exist_ok=True)
                (d / "model.safetensors").write_bytes(b"\0" * 1000)
            os.kill(os.getpid(), signal.SIGKILL)


class StopAt(TrainerCallback):
    """The tests' stop: rank 0 runs `trainguard stop` on its job after step N, as a user
    would (once: a file in the output dir remembers it), then sleeps 1 s per step until the
    drain stops the job."""

    def __init__(self, step: int) -> None:
        self.step, self.stopping = step, False

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        done = Path(args.output_dir) / "example-stopped"
        if state.global_step == self.step and os.environ.get("RANK") == "0" \
                and not done.exists():
            done.parent.mkdir(parents=True, exist_ok=True)
            done.touch()
            self.stopping = True
            subprocess.Popen([sys.executable, "-m", "trainguard", "stop",
                              os.environ["TRAINGUARD_JOB_DIR"]], stdout=subprocess.DEVNULL)
        if self.stopping:
            time.sleep(1.0)


def kill_in_save(trainer: Trainer, step: int) -> None:
    """The tests' fault: rank 1 SIGKILLs itself in checkpoint-STEP's save, first attempt."""
    save_rng = trainer._save_rng_state

    def killing(output_dir: str) -> None:
        first = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        if first and os.environ.get("RANK") == "1" and output_dir.endswith(f"-{step}"):
            os.kill(os.getpid(), signal.SIGKILL)
        save_rng(output_dir)

    trainer._save_rng_state = killing  # type: ignore[method-assign]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, help="the Trainer's output_dir")
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--save-every", type=int, default=5)
    p.add_argument("--save-total-limit", type=int, default=None)
    p.add_argument("--trainguard", action="store_true",
                   help="use trainguard.integrations.hf (else plain Trainer.train())")
    a = p.parse_args()
    set_seed(7)  # the model's initial weights too
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2)
    args = TrainingArguments(
        output_dir=a.out, max_steps=a.steps, per_device_train_batch_size=4,
        save_strategy="steps", save_steps=a.save_every, save_total_limit=a.save_total_limit,
        logging_steps=1, seed=7, data_seed=7,
        full_determinism=True, report_to=[], use_cpu=True, ddp_backend="gloo",
        dataloader_num_workers=0, disable_tqdm=True, learning_rate=1e-3)
    trainer = Trainer(model=GPT2LMHeadModel(cfg), args=args,
                      train_dataset=RandomTokens(512, seed=11))
    trainer.add_callback(Faults())
    kill = os.environ.get("EXAMPLE_KILL_AT")
    if kill:
        trainer.add_callback(KillAt(int(kill), os.environ.get("EXAMPLE_LEFTOVER") == "1"))
    if os.environ.get("EXAMPLE_KILL_IN_SAVE"):
        kill_in_save(trainer, int(os.environ["EXAMPLE_KILL_IN_SAVE"]))
    if os.environ.get("EXAMPLE_STOP_AT"):
        trainer.add_callback(StopAt(int(os.environ["EXAMPLE_STOP_AT"])))
    if a.trainguard:
        from trainguard.integrations.hf import TrainguardCallback, train

        trainer.add_callback(TrainguardCallback())
        result = train(trainer)
    else:
        result = trainer.train()
    # what a script's reporting after train() goes by (its callbacks gate on the state's flag)
    print(f"state is world process zero: {trainer.state.is_world_process_zero}", flush=True)
    if trainer.is_world_process_zero():
        print("train metrics " + json.dumps(sorted(result.metrics)), flush=True)
        losses = [[h["step"], h["loss"]] for h in trainer.state.log_history if "loss" in h]
        print("losses " + json.dumps(losses), flush=True)
        digest = hashlib.sha256()
        for name, t in sorted(trainer.model.state_dict().items()):
            digest.update(name.encode())
            digest.update(t.detach().cpu().contiguous().numpy().tobytes())
        print(f"weights sha256 {digest.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
