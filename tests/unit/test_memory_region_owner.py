"""Who makes a node's shared-memory region (review of walk-through 32 #5 and #8): a restore
onto a spare (`peer.store`, the agent's PEER_STORE op) comes before the spare's first
workers start. Without standbys nothing had made the region then: the restore made the path
itself (`mkdir(parents=True)`), the agent's `make_private` refused it as not its own, the
moved rank ran without memory snapshots (the job failed waiting for them) and the restored
copy stayed in /dev/shm after the job."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from trainguard.checkpoint.memory import RankSlots
from trainguard.node import peer, procs
from trainguard.node.memory import MemoryRegion
from trainguard.worker.contract import ENV_MEMORY_DIR, ENV_MEMORY_EVERY, ENV_SHM_ROOT


@pytest.fixture
def shm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A /dev/shm of our own: every user may write it, sticky."""
    root = tmp_path / "shm"
    root.mkdir()
    os.chmod(root, 0o1777)
    monkeypatch.setenv(ENV_SHM_ROOT, str(root))
    return root


@pytest.fixture
def guardian() -> Iterator[procs.Guardian]:
    g = procs.Guardian("")
    yield g
    g.close()


def _copy_of_rank_1(tmp_path: Path) -> list[dict[str, object]]:
    """The PEER_STORE bodies of a buddy's copy of rank 1's snapshot of step 3."""
    buddy = tmp_path / "buddy"
    (buddy / peer.PEER).mkdir(parents=True, mode=0o700)
    slots = RankSlots(buddy / peer.PEER, 1, 2, "run")
    try:
        slots.snapshot(3, {"w": torch.arange(300_000, dtype=torch.float32)})
        slots.wait()
    finally:
        slots.close()
    bodies, offset = [], 0
    while True:
        chunk = peer.take(buddy, True, 1, 3, offset)
        assert chunk is not None
        bodies.append({**chunk, "peer": False, "origin": "node-0"})
        offset += int(chunk["length"])
        if offset >= int(chunk["total"]):
            return bodies


def test_a_restore_onto_a_spare_without_standbys_is_its_region_and_is_freed(
        shm: Path, tmp_path: Path, guardian: procs.Guardian) -> None:
    bodies = _copy_of_rank_1(tmp_path)
    region = MemoryRegion("job", "node-2", guardian)  # the spare's agent, no workers yet
    try:
        assert not region.path.exists()
        for body in bodies:  # what Op.PEER_STORE does with the agent's region
            whole = peer.store(region.path, False, body, "node-0")
        assert whole
        assert (os.stat(region.path).st_mode & 0o777) == 0o700
        # the moved rank's workers start now: the region, with the restored copy in it
        assert region.env({ENV_MEMORY_EVERY: "1"}) == {ENV_MEMORY_DIR: str(region.path)}
        assert region.held() == region.path
        assert [e.step for e in peer.whole(region.path, 1)] == [3]
    finally:
        region.close()
    assert list(shm.iterdir()) == []  # the restored copy is not left in shared memory


def test_a_region_freed_with_nothing_started_on_the_spare_leaves_nothing(
        shm: Path, tmp_path: Path, guardian: procs.Guardian) -> None:
    """A spare whose workers never start (the job ended first) frees what a restore made."""
    bodies = _copy_of_rank_1(tmp_path)
    region = MemoryRegion("job", "node-2", guardian)
    for body in bodies:
        peer.store(region.path, False, body, "node-0")
    region.close()
    assert list(shm.iterdir()) == []
