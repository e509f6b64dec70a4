"""The commit waits for every rank's part through storage: no collective, no deadlock."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trainguard.checkpoint import Checkpointer, Status


def checkpointer(monkeypatch: pytest.MonkeyPatch, location: Path, rank: int,
                 **kw: object) -> Checkpointer:
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "commit-test")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    return Checkpointer(location, **kw)  # type: ignore[arg-type]


def test_a_checkpoint_is_committed_only_when_every_ranks_part_is_durable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loc = tmp_path / "ck"
    r0 = checkpointer(monkeypatch, loc, 0, commit_timeout_s=30)
    r1 = checkpointer(monkeypatch, loc, 1)
    state = {"w": torch.arange(8.0)}
    r0.save(5, state)  # rank 0 waits in the background for rank 1's part
    assert r0.list() == []  # nothing is visible before the commit
    r1.save(5, state)
    r1.wait()
    r0.wait()
    (info,) = r0.list()
    assert (info.step, info.status) == (5, Status.VALID)
    manifest = (loc / "step-000000005" / "manifest.json").read_text()
    assert "rank-00000.pt" in manifest and "rank-00001.pt" in manifest


def test_a_rank_that_never_writes_its_part_fails_the_save_without_a_deadlock(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loc = tmp_path / "ck"
    r0 = checkpointer(monkeypatch, loc, 0, commit_timeout_s=0.5)
    r1 = checkpointer(monkeypatch, loc, 1)
    state = {"w": torch.arange(8.0)}
    r0.save(5, state)
    r1.save(5, state)
    r1.wait()
    r0.wait()
    r0.save(10, state)  # rank 1 "died": its part of step 10 never comes
    r0.wait()  # returns: the commit timed out, the failure is counted, training goes on
    assert [(i.step, i.status) for i in r0.list()] == [(5, Status.VALID)]
    assert (loc / "latest").read_text() == "step-000000005"
    assert not any(p.name.startswith(".tmp-step-000000010") for p in loc.iterdir())


def test_pruning_never_trades_the_good_checkpoint_for_a_corrupt_newer_one(
        tmp_path: Path) -> None:
    loc = tmp_path / "ck"
    first = Checkpointer(loc, keep=1, async_save=False)
    first.save(100, {"w": torch.full((4,), 100.0)})
    first.save(200, {"w": torch.full((4,), 200.0)})
    data = bytearray((loc / "step-000000200" / "replicated.pt").read_bytes())
    data[-40] ^= 0xFF  # same size, wrong checksum: only a load can tell
    (loc / "step-000000200" / "replicated.pt").write_bytes(bytes(data))
    resumed = Checkpointer(loc, keep=1, async_save=False)
    target: dict[str, object] = {"w": None}
    assert resumed.load_latest(target) is None  # 200 is corrupt, 100 was pruned (keep=1)
    resumed.save(110, {"w": torch.full((4,), 110.0)})
    again: dict[str, object] = {"w": None}
    assert Checkpointer(loc).load_latest(again) == 110  # kept although 200 "looks" newer
    assert (loc / "latest").read_text() == "step-000000110"
