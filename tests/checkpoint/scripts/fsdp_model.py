"""The FSDP2 model both checkpoint test scripts train: seeded, two linear layers, each
sharded (fully_shard) and then the whole, with AdamW. Imported as a sibling module (a script's
own directory is first on sys.path)."""

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard


def sharded_model(mesh: DeviceMesh) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 8))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def train_step(model: nn.Module, opt: torch.optim.Optimizer, step: int, rank: int) -> float:
    """One seeded step (the batch depends on the step and the rank only): its loss."""
    g = torch.Generator().manual_seed(step * 100 + rank)
    x = torch.randn(8, 16, generator=g)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return float(loss.item())

