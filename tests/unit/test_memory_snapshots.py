"""Memory snapshots (checkpoint/memory.py): the format, double buffering, checks, persist.

The region is a temporary directory (tmpfs or not, the files are the same); persistence
writes a real checkpoint that the Checkpointer then loads.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from trainguard.checkpoint import Checkpointer, CheckpointError
from trainguard.checkpoint.memory import RankSlots, flatten, unflatten
from trainguard.checkpoint.memory_format import (
    agreed_step,
    memory_resume_step,
    read_manifest,
    slot_path,
    write_pin,
)
from trainguard.checkpoint.persist import persist, persist_ranks


def tree(seed: int) -> dict[str, Any]:
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(3, 8, generator=g)).sum().backward()
    opt.step()
    return {"replicated": {"model": model.state_dict(), "optimizer": opt.state_dict(),
                           "odd": (torch.tensor(3.5, dtype=torch.bfloat16),
                                   torch.tensor([True, False]), float("inf"), None, "x")},
            "rank": {"data": {"epoch": seed, "offset": 7}, "__rng__": {"torch": torch.randn(5)}}}


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return (isinstance(b, dict) and list(a) == list(b)
                and all(same(a[k], b[k]) for k in a))
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return bool(a == b)


def test_the_tree_survives_the_encoding_with_int_keys_tuples_and_odd_dtypes() -> None:
    t = tree(1)
    tensors: list[torch.Tensor] = []
    skeleton = json.loads(json.dumps(flatten(t, tensors)))  # through JSON, as on tmpfs
    back = unflatten(skeleton, tensors)
    assert same(t, back)
    assert 0 in back["replicated"]["optimizer"]["state"]  # int keys stay ints


def test_a_snapshot_reads_back_bit_for_bit_and_two_steps_stay_loadable(tmp_path: Path) -> None:
    slots = RankSlots(tmp_path, 0, 1, "run")
    for step in (1, 2, 3):
        assert slots.snapshot(step, tree(step))
    valid = slots.valid()
    assert sorted(valid) == [2, 3]
    assert same(slots.read(valid[3]), tree(3)) and same(slots.read(valid[2]), tree(2))
    assert all(e.crc32 is not None for e in valid.values())  # checksummed after the copy
    slots.close()
    again = RankSlots(tmp_path, 0, 1, "run")  # a restarted worker: generations go on
    assert again.snapshot(4, tree(4))
    assert sorted(again.valid()) == [3, 4]
    again.close()


def test_with_peer_copies_the_last_step_copied_whole_outlives_the_one_being_copied(
        tmp_path: Path) -> None:
    # a copy round pins the step it copies (S) beside the last one copied whole (P); a rank
    # may have overwritten S before the pin reached it, or the round may break off: P must
    # still be there, however many snapshots the rank takes meanwhile (a node lost then
    # resumes every rank at P, the step its buddy holds whole)
    slots = RankSlots(tmp_path, 0, 1, "run", pinned=True)
    for step in (1, 2, 3):
        assert slots.snapshot(step, tree(step))
    write_pin(tmp_path, 0, [1, 3])  # P = 1 copied whole, S = 3 being copied
    for step in range(4, 10):
        assert slots.snapshot(step, tree(step))
        assert {1, 3} <= set(slots.valid()), step
    assert sorted(slots.valid()) == [1, 3, 8, 9]
    assert same(slots.read(slots.valid()[1]), tree(1))
    write_pin(tmp_path, 0, [3])  # S's round ended whole: P is let go
    for step in (10, 11):
        assert slots.snapshot(step, tree(step))
    assert sorted(slots.valid()) == [3, 9, 10, 11]
    slots.close()


def test_a_copy_that_breaks_off_leaves_the_other_slot_whole(tmp_path: Path) -> None:
    slots = RankSlots(tmp_path, 0, 1, "run")
    assert slots.snapshot(1, tree(1))
    assert slots.snapshot(2, tree(2))
    broken = tree(3)
    broken["rank"]["late"] = torch.empty(4, device="meta")  # copying it raises mid-snapshot
    with pytest.raises(NotImplementedError):
        slots.snapshot(3, broken)
    valid = slots.valid()
    assert sorted(valid) == [2]  # slot of step 1 was being overwritten: no longer named
    assert same(slots.read(valid[2]), tree(2))
    slots.close()


def test_torn_bytes_are_found_by_the_checksum(tmp_path: Path) -> None:
    slots = RankSlots(tmp_path, 0, 1, "run")
    slots.snapshot(1, tree(1))
    slots.snapshot(2, tree(2))
    slots.close()
    entry = next(e for e in read_manifest(tmp_path, 0).slots if e.step == 2)  # type: ignore
    with open(slot_path(tmp_path, 0, entry.slot), "r+b") as f:
        f.seek(5)
        f.write(b"\xff\xfe")
    fresh = RankSlots(tmp_path, 0, 1, "run")
    assert sorted(fresh.valid()) == [1]
    fresh.close()


def test_snapshots_of_another_run_or_world_size_are_not_loadable(tmp_path: Path) -> None:
    old = RankSlots(tmp_path, 0, 2, "old-run")
    old.snapshot(5, tree(5))
    old.close()
    assert RankSlots(tmp_path, 0, 2, "new-run").valid() == {}
    assert RankSlots(tmp_path, 0, 4, "old-run").valid() == {}


def test_too_little_shared_memory_is_a_clear_error_before_any_copy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.statvfs(tmp_path)

    class Tiny:
        f_bavail, f_frsize = 0, real.f_frsize

    monkeypatch.setattr(os, "statvfs", lambda p: Tiny())
    slots = RankSlots(tmp_path, 0, 1, "run")
    with pytest.raises(CheckpointError, match=r"2 slots.*--shm-size.*--memory-every 0"):
        slots.snapshot(1, tree(1))
    assert slots.valid() == {}
    slots.close()


@pytest.mark.parametrize(("lists", "stored", "want"), [
    ([[3, 4], [4, 5]], [2, 2], 4),  # the newest step both ranks hold
    ([[3, 4], [5, 6]], [None, None], None),  # nothing in common: storage
    ([[3, 4], [3, 4]], [4, 4], 4),  # storage as new: memory (faster, same step)
    ([[3, 4], [3, 4]], [None, 6], None),  # a rank sees a newer checkpoint: storage
    ([[], [4]], [None, None], None),
])
def test_the_resume_step_is_one_every_rank_holds_and_never_older_than_storage(
        lists: list[list[int]], stored: list[int | None], want: int | None) -> None:
    assert memory_resume_step(lists, stored) == want
    assert agreed_step([]) is None


def test_persisting_writes_a_checkpoint_the_checkpointer_loads(tmp_path: Path) -> None:
    region, store = tmp_path / "region", tmp_path / "ckpt"
    region.mkdir()
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(3, 8)).sum().backward()
    opt.step()
    for rank in (0, 1):
        slots = RankSlots(region, rank, 2, "run")
        for step in (6, 7):
            slots.snapshot(step, {"replicated": {"model": model.state_dict(),
                                                 "optimizer": opt.state_dict()},
                                  "rank": {"__rng__": {"torch": torch.get_rng_state()}}})
        slots.close()
    # the attempt that died reached step 6: step 7 is the restarted workers' own snapshot
    assert persist(str(region), str(store), 2, "run", at_most=6) == 6
    assert persist(str(region), str(store), 2, "run", at_most=5) is None  # none that old
    assert persist(str(region), str(store), 2, "run") == 7
    assert persist(str(region), str(store), 2, "run") is None  # storage has it already
    fresh = torch.nn.Linear(8, 4)
    fresh_opt = torch.optim.AdamW(fresh.parameters())
    ckpt = Checkpointer(store, save_on_exit=False, memory_every=0)
    assert ckpt.load_latest({"model": fresh, "optimizer": fresh_opt}) == 7
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                 fresh.state_dict().values(), strict=True))


def test_a_save_spread_over_nodes_commits_once_every_node_wrote_its_ranks(
        tmp_path: Path) -> None:
    """After a node loss: the survivor writes rank 0 from its region, the lost node's buddy
    rank 1 from its peer copy, under one token; rank 0's part commits the checkpoint."""
    own, copies, store = tmp_path / "node-0", tmp_path / "node-2" / "peer", tmp_path / "ckpt"
    model = torch.nn.Linear(8, 4)
    for rank, region in ((0, own), (1, copies)):
        region.mkdir(parents=True)
        slots = RankSlots(region, rank, 2, "run")
        for step in (6, 7):
            slots.snapshot(step, {"replicated": {"model": model.state_dict()},
                                  "rank": {"data": {"rank": rank, "step": step}}})
        slots.close()
    assert persist_ranks({1: str(copies)}, str(store), 2, "run", 5, exact=True) is None
    assert Checkpointer(store, save_on_exit=False, memory_every=0).load_latest(
        {"model": torch.nn.Linear(8, 4)}) is None  # rank 1's part alone commits nothing
    assert persist_ranks({1: str(copies)}, str(store), 2, "run", 6, exact=True,
                         token="t", source="peer") == 6
    assert persist_ranks({0: str(own)}, str(store), 2, "run", 6, exact=True,
                         token="t", source="peer") == 6
    fresh = torch.nn.Linear(8, 4)
    assert Checkpointer(store, save_on_exit=False, memory_every=0).load_latest(
        {"model": fresh}) == 6
    assert torch.equal(fresh.weight, model.weight)


def test_a_resume_from_memory_past_storage_is_written_by_close_unless_a_save_covers_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Walk-through 40 #1: under the llm preset the storage filled up, the last save failed
    and close() raised; the restart resumed the run's last step from the node's memory, ran
    no step, and close() had nothing to write: the job succeeded with that step in no
    storage (the region is freed with the job). A step resumed from memory that storage
    does not hold is owed: close() writes the last step boundary since, unless a save at or
    past that step started; only while no optimizer step ran past that boundary (review 49
    #2: a step that raised after its optimizer step had its weights written as the step
    before), and never after an in-process restart abandoned the Checkpointer (#3)."""
    from trainguard.worker.contract import ENV_MEMORY_DIR, ENV_RUN_ID

    region, store = tmp_path / "region", tmp_path / "ckpt"
    region.mkdir()
    monkeypatch.setenv(ENV_MEMORY_DIR, str(region))
    monkeypatch.setenv(ENV_RUN_ID, "run")
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(2, 8)

    def train_step() -> None:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()

    def attempt(steps: range, every: int = 100, *, raise_at: int | None = None,
                abandon: bool = False) -> tuple[int | None, list[int]]:
        ckpt = Checkpointer(store, save_on_exit=False, memory_every=1, every_steps=every,
                            async_save=False)
        start = ckpt.load_latest({"model": model, "optimizer": opt})
        try:
            for step in steps:
                train_step()
                if step == raise_at:
                    raise ValueError(f"loss is NaN at step {step}")  # after its optimizer step
                ckpt.maybe_save(step, {"model": model, "optimizer": opt})
            if abandon:
                ckpt.abandon()
        except ValueError:
            pass
        finally:
            ckpt.close()
        return start, [c.step for c in ckpt.list()]

    assert attempt(range(1, 4)) == (None, [])  # snapshots 1..3 in memory, none saved
    assert attempt(range(4, 4)) == (3, [3])  # resumed at the last step: close() writes it
    assert attempt(range(4, 4)) == (3, [3])  # storage holds it now: nothing owed
    assert attempt(range(4, 6)) == (3, [3])  # a restart from storage owes nothing either
    weight = model.weight.detach().clone()  # memory (step 5) is past storage (3) again
    assert attempt(range(6, 8)) == (5, [7, 3])  # steps on, no save due: the last one written
    fresh = torch.nn.Linear(8, 4)
    assert Checkpointer(store, save_on_exit=False, memory_every=0).load_latest(
        {"model": fresh}) == 7
    assert not torch.equal(fresh.weight, weight)
    assert torch.equal(fresh.weight, model.weight)  # step 7's weights, as the run ended
    assert attempt(range(8, 11), every=2)[1] == [10, 8, 7]  # a save at or past 8: none extra
    assert attempt(range(11, 13)) == (10, [10, 8, 7])  # memory 12 past storage 10 again
    # step 13 raises after its optimizer step: the state is not step 12's any more
    assert attempt(range(13, 15), raise_at=13) == (12, [10, 8, 7])
    assert attempt(range(13, 14), abandon=True) == (12, [10, 8, 7])  # the old group's step
