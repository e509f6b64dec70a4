"""Who makes a node's shared-memory region (review of walk-through 32 #5 and #8): a restore
onto a spare (`peer.store`, the agent's PEER_STORE op) comes before the spare's first
workers start. Without standbys nothing had made the region then: the restore made the path
itself (`mkdir(parents=True)`), the agent's `make_private` refused it as not its own, the
moved rank ran without memory snapshots (the job failed waiting for them) and the restored
copy stayed in /dev/shm after the job. And where it may be made (#8): not in a root its
group may write (a group member could swap it for a symlink), and a peer copy writes
through no symlink put in its place."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from trainguard.checkpoint import memory_format
from trainguard.checkpoint.memory import RankSlots
from trainguard.node import peer, procs
from trainguard.node.memory import MemoryRegion
from trainguard.worker.contract import ENV_MEMORY_DIR, ENV_MEMORY_EVERY


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


def test_a_root_its_group_may_write_is_refused_with_the_fix(tmp_path: Path) -> None:
    root = tmp_path / "group-scratch"
    root.mkdir()
    os.chmod(root, 0o775)  # a project group's scratch dir, not sticky
    with pytest.raises(OSError, match=r"writable by its group .* not sticky.*Fix: chmod \+t"):
        memory_format.make_private(root / "region")
    assert list(root.iterdir()) == []
    os.chmod(root, 0o1775)  # sticky: nobody renames another's entry
    memory_format.make_private(root / "region")


def test_a_peer_copy_writes_through_no_symlink_put_in_the_regions_place(
        shm: Path, tmp_path: Path, guardian: procs.Guardian) -> None:
    """The reviewer's end-to-end plant (/tmp/rv32/grp.py): the region renamed away and a
    symlink to a dir of theirs put at its path, holding rank-1/slot-N.bin -> a file only the
    job's user could write; the agent's peer copy wrote the model's bytes into it."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    bodies = _copy_of_rank_1(tmp_path)
    region = MemoryRegion("job", "node-2", guardian)
    try:
        assert region.env({ENV_MEMORY_EVERY: "1"})
        theirs = tmp_path / "theirs"
        (theirs / "rank-1").mkdir(parents=True)
        for n in range(4):
            (theirs / "rank-1" / f"slot-{n}.bin").symlink_to(victim)
        region.path.rename(tmp_path / "moved-away")
        region.path.symlink_to(theirs)
        with pytest.raises(OSError, match="symlink"):
            peer.store(region.path, False, bodies[0], "node-0")
        region.path.unlink()  # and a rank dir of the region that is a symlink
        (tmp_path / "moved-away").rename(region.path)
        (region.path / "rank-1").symlink_to(theirs / "rank-1")
        with pytest.raises(OSError, match="symlink"):
            peer.store(region.path, False, bodies[0], "node-0")
    finally:
        region.close()
    assert victim.read_text() == "precious\n"
