"""ResumableSampler: DistributedSampler's order, and a saved position that resumes exactly."""

from __future__ import annotations

import io
from itertools import islice
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, TensorDataset

from trainguard.checkpoint.sampler import (
    ResumableSampler,
    data_state,
    is_data_position,
    load_data_state,
)

N = 22  # 11 samples per rank at world size 2: 3 batches of 4, the last one short
EPOCHS = range(2)


def roundtrip(state: dict[str, Any]) -> dict[str, Any]:
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    loaded: dict[str, Any] = torch.load(buf, weights_only=True)
    return loaded


def loader_on(sampler: ResumableSampler, n: int = N) -> DataLoader[Any]:
    return DataLoader(TensorDataset(torch.arange(n)), batch_size=4, sampler=sampler)


def train(loader: Any, sampler: ResumableSampler, epochs: range,
          limit: int | None = None) -> list[list[int]]:
    """The batches a training loop sees, stopping after `limit` without fetching one more."""
    seen: list[list[int]] = []
    for epoch in epochs:
        sampler.set_epoch(epoch)
        batches = iter(loader)
        while limit is None or len(seen) < limit:
            batch = next(batches, None)
            if batch is None:
                break
            seen.append(batch[0].tolist())
        if limit is not None and len(seen) == limit:
            break
    return seen


@pytest.mark.parametrize("n", [0, 1, 5, 12, 13])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize(("shuffle", "drop_last"), [(True, False), (True, True), (False, False)])
def test_the_order_equals_distributed_samplers_for_every_rank_and_epoch(
        n: int, world_size: int, shuffle: bool, drop_last: bool) -> None:
    for rank in range(world_size):
        ours = ResumableSampler(n, shuffle=shuffle, seed=7, rank=rank, world_size=world_size,
                                drop_last=drop_last)
        theirs: DistributedSampler[int] = DistributedSampler(
            TensorDataset(torch.arange(n)), num_replicas=world_size, rank=rank,
                                    shuffle=shuffle, seed=7, drop_last=drop_last)
        for epoch in (0, 1, 5):
            ours.set_epoch(epoch)
            theirs.set_epoch(epoch)
            assert list(ours) == list(theirs)
            assert len(ours) == len(theirs)


@pytest.mark.parametrize("k", [0, 1, 2, 3, 4, 5])  # 3 batches per epoch: 3 is an epoch's end
def test_a_resumed_loader_continues_with_the_batches_of_an_uninterrupted_run(k: int) -> None:
    def sampler() -> ResumableSampler:
        return ResumableSampler(N, seed=3, rank=1, world_size=2)

    whole = train(loader_on(first := sampler()), first, EPOCHS)
    before = train(loader_on(first := sampler()), first, EPOCHS, limit=k)
    state = roundtrip(data_state(first))
    second = sampler()
    load_data_state(second, state)
    after = train(loader_on(second), second, range(state["epoch"], EPOCHS.stop))
    assert before + after == whole
    assert len(whole) == 6


def test_the_state_is_plain_ints_and_bools_and_loads_with_weights_only(tmp_path: Any) -> None:
    s = ResumableSampler(10, seed=1, rank=0, world_size=2)
    s.set_epoch(4)
    list(islice(s, 3))
    torch.save(s.state_dict(), tmp_path / "data.pt")
    state = torch.load(tmp_path / "data.pt", weights_only=True)
    assert state == {"epoch": 4, "position": 3, "seed": 1, "dataset_len": 10,
                     "world_size": 2, "shuffle": True, "drop_last": False}


def test_an_exhausted_epoch_yields_nothing_until_set_epoch() -> None:
    s = ResumableSampler(6, rank=0, world_size=1)
    assert len(list(s)) == 6
    assert list(s) == []
    s.set_epoch(0)
    assert list(s) == []
    s.set_epoch(1)
    assert len(list(s)) == 6 and s.position == 6


@pytest.mark.parametrize(("field", "saved", "fix"), [
    ("world_size", 4, "same world size"), ("dataset_len", 99, "same dataset"),
    ("seed", 5, "saved seed"), ("shuffle", False, "saved shuffle")])
def test_a_state_from_a_different_setup_is_refused_naming_field_values_and_fix(
        field: str, saved: object, fix: str) -> None:
    state = ResumableSampler(10, rank=0, world_size=2).state_dict() | {field: saved}
    current = ResumableSampler(10, rank=0, world_size=2)
    with pytest.raises(ValueError, match=field) as err:
        current.load_state_dict(state)
    msg = str(err.value)
    assert repr(saved) in msg and repr(current.state_dict()[field]) in msg
    assert fix in msg and "set_epoch" in msg


def test_a_position_past_the_epoch_is_refused() -> None:
    s = ResumableSampler(10, rank=0, world_size=2)
    with pytest.raises(ValueError, match=r"position must be an int in \[0, 5\]"):
        s.load_state_dict(s.state_dict() | {"position": 6})


@pytest.mark.parametrize(("n", "drop_last"), [(12, False), (13, True)])
def test_two_ranks_partition_the_data_without_overlap(n: int, drop_last: bool) -> None:
    ranks = [set(ResumableSampler(n, seed=2, rank=r, world_size=2, drop_last=drop_last))
             for r in range(2)]
    assert not ranks[0] & ranks[1]
    assert len(ranks[0] | ranks[1]) == n // 2 * 2


def test_rank_and_world_size_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    s = ResumableSampler(9)
    assert (s.rank, s.world_size, len(s)) == (2, 3, 3)
    monkeypatch.setenv("RANK", "3")
    with pytest.raises(ValueError, match="rank=3"):
        ResumableSampler(9)


def test_data_position_is_found_on_a_sampler_or_a_loader_built_on_one() -> None:
    s = ResumableSampler(8, rank=0, world_size=1)
    ds = TensorDataset(torch.arange(8))
    by_batch_sampler = DataLoader(ds, batch_sampler=BatchSampler(s, 2, drop_last=False))
    for obj in (s, DataLoader(ds, sampler=s), by_batch_sampler):
        assert is_data_position(obj)
    next(iter(by_batch_sampler))
    assert data_state(by_batch_sampler)["position"] == 2
    others: list[object] = [DataLoader(ds), s.state_dict(), None]
    assert not any(is_data_position(obj) for obj in others)
    with pytest.raises(TypeError, match="has no data position"):
        data_state(DataLoader(ds))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 40), world_size=st.integers(1, 5), data=st.data(),
       seed=st.integers(0, 2**31), epoch=st.integers(0, 50), shuffle=st.booleans(),
       drop_last=st.booleans())
def test_a_resumed_sampler_continues_the_uninterrupted_sequence(
        n: int, world_size: int, data: st.DataObject, seed: int, epoch: int, shuffle: bool,
        drop_last: bool) -> None:
    rank = data.draw(st.integers(0, world_size - 1))

    def sampler() -> ResumableSampler:
        s = ResumableSampler(n, shuffle=shuffle, seed=seed, rank=rank, world_size=world_size,
                             drop_last=drop_last)
        s.set_epoch(epoch)
        return s

    whole = list(sampler())
    k = data.draw(st.integers(0, len(whole)))
    first = sampler()
    before = list(islice(first, k))
    second = sampler()
    second.load_state_dict(roundtrip(first.state_dict()))
    assert before + list(second) == whole


@pytest.mark.filterwarnings("ignore:.set_vital. is deprecated")
@pytest.mark.parametrize("k", [2, 3, 4])
def test_a_stateful_dataloader_with_workers_resumes_exactly(k: int) -> None:
    stateful = pytest.importorskip("torchdata.stateful_dataloader")

    def setup() -> tuple[Any, ResumableSampler]:
        s = ResumableSampler(N, seed=3, rank=1, world_size=2)
        ds = TensorDataset(torch.arange(N))
        return stateful.StatefulDataLoader(ds, batch_size=4, sampler=s, num_workers=2), s

    whole = train(*setup(), EPOCHS)
    loader, s = setup()
    assert is_data_position(loader)
    before = train(loader, s, EPOCHS, limit=k)
    state, epoch = roundtrip(data_state(loader)), s.epoch
    if k == 2:
        assert s.position > 8  # the workers prefetched past what the loop consumed
    loader, s = setup()
    load_data_state(loader, state)  # applied when the loader's next iterator starts
    after = train(loader, s, range(epoch, EPOCHS.stop))
    assert before + after == whole
