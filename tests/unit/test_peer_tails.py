"""Tails of memory snapshots (node/peer.py `tails`, `store` with a patch; controller/
peer_tails.py's plan): a lost rank's newest snapshot rebuilt from a surviving rank's bytes
and its own small tensors, bit for bit or not at all. Real slot files in a temporary dir."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import torch

from trainguard.checkpoint.memory import RankSlots, read_entry
from trainguard.checkpoint.memory_format import SlotEntry, read_manifest
from trainguard.controller.peer_tails import Tails
from trainguard.node import peer


def state(model: torch.nn.Module, rank: int, step: int, big_per_rank: bool = False
          ) -> dict[str, Any]:
    """What a data-parallel rank snapshots: the same model on every rank, its own RNG
    state and data position (small), and, when `big_per_rank`, a large tensor of its own."""
    gen = torch.Generator().manual_seed(1000 * rank + step)
    out: dict[str, Any] = {"model": model.state_dict(),
                           "rng": torch.randint(0, 255, (5056,), dtype=torch.uint8,
                                                generator=gen),
                           "data": {"rank": rank, "position": step * 32 + rank}}
    if big_per_rank:
        out["buffer"] = torch.randn(64, 1024, generator=gen)  # 256 KiB, differs per rank
    return out


def snapshot(region: Path, rank: int, steps: list[int], model: torch.nn.Module,
             big_per_rank: bool = False) -> None:
    region.mkdir(parents=True, exist_ok=True)
    slots = RankSlots(region, rank, 2, "run")
    for step in steps:
        slots.snapshot(step, state(model, rank, step, big_per_rank))
    slots.close()


def rebuild(survivor: Path, source: int, buddy: Path, tail: dict[str, Any],
            step: int) -> bool:
    """What the controller does, without the wire: the survivor's chunks, the tail's
    entry and rank, its small tensors with the last chunk."""
    offset = 0
    while True:
        chunk = peer.take(survivor, False, source, step, offset)
        assert chunk is not None
        last = offset + chunk["length"] >= chunk["total"]
        body = {**chunk, "rank": 1,
                "entry": tail["entry"], **({"patch": tail["small"]} if last else {})}
        if peer.store(buddy, True, body, "node-0"):
            return True
        if last:
            return False
        offset += chunk["length"]


def test_a_lost_ranks_newest_snapshot_is_rebuilt_bit_for_bit_from_a_survivor_and_its_tail(
        tmp_path: Path) -> None:
    model = torch.nn.Linear(256, 64)  # 64 KiB of weight: more than a tail carries
    node0, node1, buddy = tmp_path / "node-0", tmp_path / "node-1", tmp_path / "node-2"
    snapshot(node0, 0, [7, 8], model)
    snapshot(node1, 1, [7, 8], model)
    tails = peer.tails(node1, {})
    assert set(tails) == {1}
    tail = tails[1]
    entry = SlotEntry(**tail["entry"])
    assert entry.step == 8 and entry.crc32 is not None
    sizes = [entry.tensors[i]["nbytes"] for i, _ in tail["small"]]
    assert 5056 in sizes and 64 * 256 * 4 not in sizes  # the RNG state, not the weight
    assert peer.tails(node1, {1: entry.generation}) == {}  # nothing newer: nothing sent

    assert rebuild(node0, 0, buddy, tail, 8)
    (copied,) = [e for e in read_manifest(buddy / peer.PEER, 1).slots if e.step == 8]
    got = read_entry(buddy / peer.PEER, 1, copied)
    want = read_entry(node1, 1, entry)
    assert got["data"] == want["data"] == {"rank": 1, "position": 8 * 32 + 1}
    assert torch.equal(got["rng"], want["rng"])
    assert all(torch.equal(got["model"][k], want["model"][k]) for k in want["model"])
    assert copied.crc32 == entry.crc32 and copied.origin == "node-0"


def test_a_large_tensor_of_its_own_makes_the_rebuild_fail_and_commits_nothing(
        tmp_path: Path) -> None:
    model = torch.nn.Linear(16, 4)
    node0, node1, buddy = tmp_path / "node-0", tmp_path / "node-1", tmp_path / "node-2"
    snapshot(node0, 0, [3], model, big_per_rank=True)
    snapshot(node1, 1, [3], model, big_per_rank=True)
    tail = peer.tails(node1, {})[1]
    with pytest.raises(ValueError, match="CRC-32"):
        rebuild(node0, 0, buddy, tail, 3)
    manifest = read_manifest(buddy / peer.PEER, 1)
    assert manifest is None or not manifest.slots


def test_a_rank_whose_small_tensors_exceed_the_tail_has_none(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    snapshot(tmp_path, 1, [2], torch.nn.Linear(16, 4))
    monkeypatch.setattr(peer, "TAIL_BYTES", 1024)
    assert peer.tails(tmp_path, {}) == {}


def test_the_plan_takes_a_survivor_with_the_same_layout_at_that_step(tmp_path: Path) -> None:
    node0, node1, odd = tmp_path / "node-0", tmp_path / "node-1", tmp_path / "odd"
    snapshot(node0, 0, [4, 5], torch.nn.Linear(16, 4))
    snapshot(node1, 1, [4, 5], torch.nn.Linear(16, 4))
    snapshot(odd, 2, [5], torch.nn.Linear(16, 8))  # another model: another layout
    tails = {1: {5: peer.tails(node1, {})[1]}}

    def held(region: Path, rank: int) -> dict[int, SlotEntry]:
        return {e.step: e for e in peer.whole(region, rank)}

    assert Tails._plan([1], tails, {("node-0", 0): held(node0, 0)}, 5) == {1: ("node-0", 0)}
    assert Tails._plan([1], tails, {("odd", 2): held(odd, 2)}, 5) is None
    assert Tails._plan([1], tails, {("node-0", 0): {4: held(node0, 0)[4]}}, 5) is None


def test_after_a_few_steps_tails_carry_only_the_small_tensors_that_differ_between_ranks(
        tmp_path: Path) -> None:
    model = torch.nn.Linear(16, 4)  # weight and bias: small, the same on both ranks
    regions = {r: tmp_path / f"node-{r}" for r in (0, 1)}
    tails = Tails(hub=None, placement=lambda: [])  # type: ignore[arg-type]
    for step in (1, 2, 3):
        for r, region in regions.items():
            snapshot(region, r, [step], model)
            tail = peer.tails(region, {})[r]
            tails._tails.setdefault(r, {})[step] = tail
            tails._learn(step)
        assert (tails.only is None) == (step < 3)
    entry = SlotEntry(**peer.tails(regions[1], {})[1]["entry"])
    rng = next(i for i, t in enumerate(entry.tensors) if t["nbytes"] == 5056)
    assert tails.only == [rng]  # the RNG state differs; the model's tensors do not
    only = peer.tails(regions[1], {}, tails.only)[1]["small"]
    assert [i for i, _ in only] == [rng]
    # a rebuild from rank 0's bytes with only that tensor laid over them is still exact
    assert rebuild(regions[0], 0, tmp_path / "buddy", {"entry": asdict(entry), "small": only},
                   3)
