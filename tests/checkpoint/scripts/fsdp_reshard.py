"""2 ranks save an FSDP2 (CPU, gloo) checkpoint at steps 5 and 10; a shard byte of rank 1 in
step 10 is flipped; 1 rank resumes. Prints the step it resumed from as JSON (walk-through
31 #6: the 1-rank resume read rank 1's shard without checking it).

python fsdp_reshard.py LOCATION PORT
"""

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from fsdp_model import sharded_model
from torch.distributed.device_mesh import init_device_mesh

from trainguard.checkpoint import Checkpointer


def rank_main(rank: int, world: int, loc: str, port: int, mode: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    model, opt = sharded_model(mesh)
    state = {"model": model, "optimizer": opt}
    ckpt = Checkpointer(loc, every_steps=5, async_save=False)
    if mode == "save":
        for step in range(1, 11):
            loss = model(torch.randn(8, 16)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            ckpt.maybe_save(step, state)
    else:
        print(json.dumps({"resumed": ckpt.load_latest(state)}), flush=True)
    ckpt.close()
    dist.destroy_process_group()


def main() -> None:
    loc, port = sys.argv[1], int(sys.argv[2])
    mp.start_processes(rank_main, args=(2, loc, port, "save"), nprocs=2, start_method="fork")
    shard = Path(loc) / "step-000000010" / "sharded" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x10
    shard.write_bytes(bytes(data))
    mp.start_processes(rank_main, args=(1, loc, port + 1, "load"), nprocs=1,
                       start_method="fork")


if __name__ == "__main__":
    main()
