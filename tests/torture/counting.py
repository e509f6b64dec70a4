"""A job whose every step is checkable bit for bit: the memory-snapshot torture's worker.

Each rank holds a large int64 tensor `x` with x == 1 + 2 + ... + step everywhere after `step`
steps (x += step: every element changes each step, so a torn copy can never pass), and
snapshots it into memory every step (Checkpointer(memory_every=1), no durable saves). After
a load it checks every element and prints `RESUMED <step> OK` (or exits 3 with BAD). It
loads before its process group exists (the ranks agree through the launcher); the group's
all-reduce each step keeps the ranks in step, as a real job's gradients do. Each start
writes the process id to JOB_DIR/pids/rank-R for the killer.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path

import torch

import trainguard
from trainguard.checkpoint import Checkpointer


def triangle(step: int) -> int:
    return step * (step + 1) // 2


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--mib", type=int, default=32, help="size of x per rank")
    args = p.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    pids = Path(os.environ["TRAINGUARD_JOB_DIR"]) / "pids"
    pids.mkdir(exist_ok=True)
    (pids / f"rank-{rank}").write_text(str(os.getpid()))
    state = {"x": torch.zeros(args.mib << 17, dtype=torch.int64)}
    ckpt = Checkpointer(memory_every=1, save_on_exit=False)
    start = ckpt.load_latest(state) or 0
    if start:
        ok = bool(torch.all(state["x"] == triangle(start)))
        print(f"RESUMED {start} {'OK' if ok else 'BAD'}", flush=True)
        if not ok:
            return 3
    # the process group comes after the load; its all-reduce keeps the ranks in step
    dist = torch.distributed
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dist.init_process_group("gloo")
    for step in range(start + 1, args.steps + 1):
        if dist.is_initialized():
            dist.all_reduce(torch.zeros(1))
        state["x"] += step
        print(f"step {step}", flush=True)
        trainguard.progress(step)
        ckpt.maybe_save(step, state)
    ckpt.close()
    if dist.is_initialized():
        dist.destroy_process_group()
    digest = hashlib.sha256(state["x"].numpy().tobytes()).hexdigest()
    print(f"DONE {args.steps} x-sha256 {digest}", flush=True)
    return 0 if bool(torch.all(state["x"] == triangle(args.steps))) else 3


if __name__ == "__main__":
    sys.exit(main())
