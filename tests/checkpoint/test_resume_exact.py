"""A resumed run continues bit for bit: N steps straight == N/2 + resume + N/2."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainguard.checkpoint import Checkpointer, ResumableSampler

N = 40


def make(seed: int = 0) -> dict[str, Any]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=N)
    data = TensorDataset(torch.randn(50, 8), torch.randn(50, 1))
    sampler = ResumableSampler(len(data), seed=seed, rank=0, world_size=1)
    # DataLoader draws a seed from the global torch RNG for every new iterator; a resumed run
    # creates one more iterator than an uninterrupted one, so give the loader its own RNG.
    loader = DataLoader(data, batch_size=4, sampler=sampler, generator=torch.Generator())
    return {"model": model, "optimizer": opt, "scheduler": sched, "sampler": sampler,
            "loader": loader, "extra": {"note": "plain data", "best": 1.5}}


def train(objs: dict[str, Any], start: int, stop: int, ckpt: Checkpointer | None) -> None:
    model, opt, sched = objs["model"], objs["optimizer"], objs["scheduler"]
    sampler: ResumableSampler = objs["sampler"]
    it = iter(objs["loader"])
    for step in range(start + 1, stop + 1):
        try:
            x, y = next(it)
        except StopIteration:
            sampler.set_epoch(sampler.state_dict()["epoch"] + 1)
            it = iter(objs["loader"])
            x, y = next(it)
        noise = random.random() + float(np.random.rand())  # python and numpy RNG in the loss
        loss = ((model(x) - y) ** 2).mean() * (1 + 1e-3 * noise)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if ckpt is not None:
            ckpt.maybe_save(step, state(objs))


def state(objs: dict[str, Any]) -> dict[str, Any]:
    return {k: objs[k] for k in ("model", "optimizer", "scheduler", "sampler", "extra")}


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@pytest.mark.parametrize("async_save", [True, False])
def test_a_resumed_run_ends_with_exactly_the_parameters_of_an_uninterrupted_one(
        tmp_path: Path, async_save: bool) -> None:
    seed_all(1)
    straight = make()
    train(straight, 0, N, None)

    seed_all(1)
    first = make()
    ckpt = Checkpointer(tmp_path / "ck", every_steps=N // 2, async_save=async_save)
    train(first, 0, N // 2, ckpt)
    ckpt.close()
    # scramble every RNG, as a fresh process would have them
    seed_all(999)
    second = make(seed=0)
    second["extra"] = {}
    ckpt2 = Checkpointer(tmp_path / "ck")
    resumed = ckpt2.load_latest(state(second))
    assert resumed == N // 2
    # plain data cannot be loaded "into" a dict value: state() builds a new dict each time
    train(second, N // 2, N, None)
    for a, b in zip(straight["model"].state_dict().values(),
                    second["model"].state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert straight["optimizer"].state_dict()["state"][0]["exp_avg"].equal(
        second["optimizer"].state_dict()["state"][0]["exp_avg"])
    assert straight["scheduler"].state_dict() == second["scheduler"].state_dict()


def test_plain_values_in_the_state_come_back_in_place(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path / "ck")
    ckpt.save(3, {"step": 3, "history": [1.0, 2.0], "tensor": torch.arange(4)})
    ckpt.close()
    target: dict[str, Any] = {"step": 0, "history": [], "tensor": None}
    assert Checkpointer(tmp_path / "ck").load_latest(target) == 3
    assert target["step"] == 3 and target["history"] == [1.0, 2.0]
    assert torch.equal(target["tensor"], torch.arange(4))


def test_no_checkpoint_yet_gives_none(tmp_path: Path) -> None:
    assert Checkpointer(tmp_path / "empty").load_latest({"x": 1}) is None
