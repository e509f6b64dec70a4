"""FSDP2 with if_busy="skip" where only rank 0's saves are slow (its store is; the sleep
stands for it): rank 0 skips saves that rank 1, its part written, would enter. DCP's save is
a collective: every rank must decide alike (review 38 #5). With --save-on-exit, a rank
stopped at a save step (TRAINGUARD_FAULT=signal:TERM@...) saves it on its way out while the
others vote on it (review 39 #6). Run under `trainguard run`."""

import argparse
import time

import torch
import torch.distributed as dist
from fsdp_model import sharded_model, train_step
from torch.distributed.device_mesh import init_device_mesh

import trainguard.checkpoint.checkpointer as ckmod
from trainguard.checkpoint import Checkpointer
from trainguard.testing.faults import inject

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=12)
p.add_argument("--out", required=True)
p.add_argument("--save-on-exit", action="store_true")
args = p.parse_args()

dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
if dist.get_rank() == 0:
    real = ckmod.run_save

    def slow(job):  # type: ignore[no-untyped-def]
        time.sleep(0.6)
        return real(job)

    ckmod.run_save = slow
model, opt = sharded_model(mesh)
state = {"model": model, "optimizer": opt}
ckpt = Checkpointer(every_steps=2, if_busy="skip", save_on_exit=args.save_on_exit)
start = ckpt.load_latest(state) or 0
saved = []
for step in range(start + 1, args.steps + 1):
    train_step(model, opt, step, dist.get_rank())
    inject(step)
    if ckpt.maybe_save(step, state):
        saved.append(step)
    time.sleep(0.1)
ckpt.close()
print(f"rank {dist.get_rank()} started saves {saved}", flush=True)
full = {k: v.full_tensor() for k, v in model.state_dict().items()}
if dist.get_rank() == 0:
    torch.save(full, args.out)
dist.barrier()
dist.destroy_process_group()
