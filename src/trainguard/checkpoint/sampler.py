"""A distributed sampler whose data position is saved and restored with the checkpoint."""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable, Iterator
from itertools import cycle, islice
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Sampler

log = logging.getLogger(__name__)

# Fields that fix which index sits at which position; a resume must not change them.
_FIXED = ("dataset_len", "world_size", "seed", "shuffle", "drop_last")
_FIXES = {
    "dataset_len": "resume with the same dataset",
    "world_size": "resume with the same world size",
    "seed": "pass the saved seed",
    "shuffle": "pass the saved shuffle",
    "drop_last": "pass the saved drop_last",
}


class _Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


def _default(given: int | None, name: str, from_dist: Callable[[], int], fallback: int) -> int:
    """An explicit value, else torch.distributed's, else env var NAME, else `fallback`."""
    if given is not None:
        return given
    if dist.is_available() and dist.is_initialized():
        return from_dist()
    env = name.upper()
    raw = os.environ.get(env)
    if raw is None:
        return fallback
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{env}={raw!r} is not an integer: fix the environment "
                         f"or pass {name}= explicitly") from None


class ResumableSampler(Sampler[int]):
    """`DistributedSampler` with a saved position: same partition, same order, per epoch.

    Call `set_epoch(epoch)` at the start of every epoch, as with `DistributedSampler`; a
    changed epoch resets the position to 0. `position` counts the indices handed out in the
    current epoch. Once the epoch is exhausted the position stays at the end, so iterating
    again yields nothing until `set_epoch` (a checkpoint taken at the end of an epoch resumes
    without replaying it).

    Exactness: with `DataLoader(num_workers=0)` the indices handed out are the ones the loop
    consumed, so `load_state_dict(state_dict())` resumes on the next batch. With worker
    processes the DataLoader prefetches indices ahead of the loop, so the saved position runs
    ahead and a resume skips the prefetched batches: use torchdata's `StatefulDataLoader` and
    save it with `data_state` to resume exactly.
    """

    def __init__(self, dataset_len: int, *, shuffle: bool = True, seed: int = 0,
                 rank: int | None = None, world_size: int | None = None,
                 drop_last: bool = False) -> None:
        self.world_size = _default(world_size, "world_size", dist.get_world_size, 1)
        self.rank = _default(rank, "rank", dist.get_rank, 0)
        if self.world_size < 1:
            raise ValueError(f"world_size={self.world_size}: it must be at least 1")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank={self.rank} is outside [0, {self.world_size - 1}]: "
                             f"pass a rank below world_size={self.world_size}")
        if dataset_len < 0:
            raise ValueError(f"dataset_len={dataset_len}: pass len(dataset)")
        self.dataset_len = dataset_len
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0
        self._position = 0
        # As DistributedSampler: drop the uneven tail, or pad by repeating indices.
        if drop_last:
            self.num_samples = dataset_len // self.world_size
        else:
            self.num_samples = -(-dataset_len // self.world_size)
        self.total_size = self.num_samples * self.world_size

    @property
    def position(self) -> int:
        """Indices handed out in the current epoch."""
        return self._position

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's order; a different epoch starts again at position 0."""
        if epoch != self.epoch:
            self.epoch = epoch
            self._position = 0

    def indices(self) -> list[int]:
        """This rank's indices for the current epoch, in order (DistributedSampler's)."""
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order: list[int] = torch.randperm(self.dataset_len, generator=g).tolist()
        else:
            order = list(range(self.dataset_len))
        padded = list(islice(cycle(order), self.total_size))
        return padded[self.rank : self.total_size : self.world_size]

    def __iter__(self) -> Iterator[int]:
        epoch, order = self.epoch, self.indices()
        while self.epoch == epoch and self._position < len(order):
            index = order[self._position]
            self._position += 1
            yield index

    def __len__(self) -> int:
        return self.num_samples

    def state_dict(self) -> dict[str, Any]:
        """Ints and bools only, so the checkpoint loads with `torch.load(weights_only=True)`."""
        return {"epoch": self.epoch, "position": self._position, "seed": self.seed,
                "dataset_len": self.dataset_len, "world_size": self.world_size,
                "shuffle": self.shuffle, "drop_last": self.drop_last}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore epoch and position; refuse a state whose order would differ from ours."""
        current = self.state_dict()
        missing = sorted(set(current) - set(state_dict))
        if missing:
            raise ValueError(f"sampler state lacks {missing}: pass a dict that "
                             "ResumableSampler.state_dict() returned")
        for key in _FIXED:
            if state_dict[key] != current[key]:
                raise ValueError(
                    f"cannot resume the data position: {key} was {state_dict[key]!r} when "
                    f"saved and is {current[key]!r} now; {_FIXES[key]}, or skip loading the "
                    "data position and call set_epoch to start a fresh epoch")
        epoch, position = state_dict["epoch"], state_dict["position"]
        if not isinstance(epoch, int) or not isinstance(position, int) \
                or not 0 <= position <= self.num_samples:
            raise ValueError(f"sampler state has epoch={epoch!r}, position={position!r}: "
                             f"position must be an int in [0, {self.num_samples}]")
        self.epoch, self._position = epoch, position


def _stateful_loader_class() -> type[_Stateful] | None:
    """torchdata's StatefulDataLoader, or None when torchdata is not installed."""
    try:
        module = importlib.import_module("torchdata.stateful_dataloader")
    except ImportError:
        return None
    cls: type[_Stateful] = module.StatefulDataLoader
    return cls


def _position_holder(obj: object) -> _Stateful | None:
    """The object whose state is `obj`'s data position, or None."""
    stateful_loader = _stateful_loader_class()
    if stateful_loader is not None and isinstance(obj, stateful_loader):
        return obj  # checked before DataLoader, its base class
    if isinstance(obj, ResumableSampler):
        return obj
    if isinstance(obj, DataLoader):
        for sampler in (obj.sampler, getattr(obj.batch_sampler, "sampler", None)):
            if isinstance(sampler, ResumableSampler):
                return sampler
    return None


def _require(obj: object) -> _Stateful:
    holder = _position_holder(obj)
    if holder is None:
        raise TypeError(f"{type(obj).__name__} has no data position: pass a ResumableSampler, "
                        "a DataLoader built on one, or a torchdata StatefulDataLoader")
    return holder


def is_data_position(obj: object) -> bool:
    """True for a ResumableSampler, a DataLoader on one, or a torchdata StatefulDataLoader."""
    return _position_holder(obj) is not None


def data_state(obj: object) -> dict[str, Any]:
    """The data position of `obj` (see is_data_position), to save in the checkpoint."""
    holder = _require(obj)
    if isinstance(holder, ResumableSampler) and isinstance(obj, DataLoader) and obj.num_workers:
        log.warning("data position of a DataLoader with num_workers=%d includes prefetched "
                    "batches, so a resume skips them; use torchdata's StatefulDataLoader",
                    obj.num_workers)
    return holder.state_dict()


def load_data_state(obj: object, state_dict: dict[str, Any]) -> None:
    """Restore a position that `data_state` returned onto `obj` before iterating it."""
    _require(obj).load_state_dict(state_dict)
