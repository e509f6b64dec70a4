"""FSDP2 (fully_shard) on CPU with gloo, checkpointed with trainguard.checkpoint (via DCP).

Writes the full final parameters of rank 0 to --out. Run under `trainguard run`.
"""

import argparse

import torch
import torch.distributed as dist
from fsdp_model import sharded_model, train_step
from torch.distributed.device_mesh import init_device_mesh

from trainguard.checkpoint import Checkpointer
from trainguard.testing.faults import inject

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=20)
p.add_argument("--out", required=True)
args = p.parse_args()

dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
model, opt = sharded_model(mesh)
state = {"model": model, "optimizer": opt}
ckpt = Checkpointer(every_steps=5)
start = ckpt.load_latest(state) or 0
if start:
    print(f"resumed from step {start}", flush=True)
for step in range(start + 1, args.steps + 1):
    loss = train_step(model, opt, step, dist.get_rank())
    print(f"step {step} loss {loss:.5f}", flush=True)
    ckpt.maybe_save(step, state)
    inject(step)
ckpt.close()
full = {k: v.full_tensor() for k, v in model.state_dict().items()}
if dist.get_rank() == 0:
    torch.save(full, args.out)
dist.barrier()
dist.destroy_process_group()
