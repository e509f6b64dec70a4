"""Peer copies of memory snapshots, the node agent's side (checkpoint/memory_format.py layout).

A multi-node job's controller copies each node's newest memory snapshots to a buddy node
(controller/peer_copies.py), chunk by chunk over the agent links:

- `steps` lists the node's ranks' whole snapshots (their CRC-32 known), and `pin` makes
  every rank keep the steps named (the last one copied whole and the one being copied, in
  two more slots);
- `take` reads a chunk of a rank's whole snapshot (the slot locked shared while read, the
  manifest re-checked), from the node's own ranks or from the copies it keeps for its
  neighbour (`peer/` in its region);
- `store` writes a chunk into the other slot of a rank's copy (`peer/`), or, when a
  pod-level move brings a rank to this node, into the rank's own place, where its worker
  finds it as a memory snapshot of its own. The last chunk checks the CRC and commits the
  manifest entry, with the node it came from as `origin`.

Standard library only: the agent never imports torch.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import os
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from trainguard.checkpoint.memory_format import (
    SLOTS,
    MemoryManifest,
    SlotEntry,
    close_slot_bytes,
    free_slot,
    open_slot_bytes,
    rank_dir,
    read_manifest,
    slot_path,
    write_manifest,
    write_pin,
)

PEER = "peer"  # the copies a node keeps for its neighbour, in its region
CHUNK_BYTES = 16 << 20  # per command: under the wire's 64 MiB frame once in base64


def where(region: Path, peer: bool) -> Path:
    return region / PEER if peer else region


def whole(region: Path, rank: int) -> list[SlotEntry]:
    """The rank's snapshots whose CRC-32 is known (a copy must be checkable)."""
    m = read_manifest(region, rank)
    return [e for e in (m.slots if m is not None else []) if e.crc32 is not None]


def ranks_in(region: Path) -> list[int]:
    if not region.is_dir():
        return []
    return sorted(int(p.name[5:]) for p in region.iterdir()
                  if p.name.startswith("rank-") and p.name[5:].isdigit())


def steps(region: Path) -> dict[int, list[int]]:
    """Per rank of this node, the steps of its whole snapshots."""
    return {r: sorted(e.step for e in whole(region, r)) for r in ranks_in(region)}


def pin(region: Path, steps: list[int]) -> None:
    """Every rank of this node keeps its snapshots of `steps` (copied to a peer)."""
    for r in ranks_in(region):
        write_pin(region, r, steps)


def take(region: Path, peer: bool, rank: int, step: int | None = None,
         offset: int = 0) -> dict[str, Any] | None:
    """A chunk of the rank's whole snapshot of `step` (None: its newest) from `offset`, from
    the node's own ranks or from the copies it keeps (`peer`); None when there is none (or
    it is being overwritten). The body: rank, entry, offset, length and data (base64) of
    the chunk, total."""
    base = where(region, peer)
    found = [e for e in whole(base, rank) if step is None or e.step == step]
    e = max(found, key=lambda x: x.generation, default=None)
    if e is None:
        return None
    try:
        view, handle = open_slot_bytes(base, rank, e, lock=True)
    except (OSError, ValueError):
        return None
    try:
        data = bytes(view[offset:offset + CHUNK_BYTES])
    finally:
        view.release()
        close_slot_bytes(handle)
    return {"rank": rank, "entry": asdict(e), "offset": offset, "total": e.size,
            "length": len(data), "data": base64.b64encode(data).decode("ascii")}


def store(region: Path, peer: bool, body: dict[str, Any], origin: str) -> bool:
    """Write one chunk; True once the snapshot is whole and committed."""
    base = where(region, peer)
    rank, offset = int(body["rank"]), int(body["offset"])
    entry = SlotEntry(**body["entry"])
    data = base64.b64decode(body["data"])
    rank_dir(base, rank).mkdir(mode=0o700, parents=True, exist_ok=True)
    manifest = read_manifest(base, rank) or MemoryManifest(rank)
    target = _target(manifest, entry)
    if offset == 0:  # a new copy: its slot holds no whole snapshot from now on
        manifest = manifest.without(target)
        write_manifest(base, manifest)
    fd = os.open(slot_path(base, rank, target), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if os.fstat(fd).st_size < entry.size:
            os.posix_fallocate(fd, 0, entry.size)
        os.pwrite(fd, data, offset)
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    if offset + len(data) < int(body["total"]):
        return False
    copied = replace(entry, slot=target, origin=entry.origin or origin,
                     generation=_generation(manifest, entry))
    view, handle = open_slot_bytes(base, rank, copied)  # raises when the CRC-32 differs
    view.release()
    close_slot_bytes(handle)
    write_manifest(base, manifest.with_entry(copied))
    return True


def _target(manifest: MemoryManifest, entry: SlotEntry) -> int:
    """The slot a copy goes into: the one not holding the newest (a later chunk of the same
    copy finds the same: the first dropped it from the manifest)."""
    return free_slot(manifest, SLOTS)


def _generation(manifest: MemoryManifest, entry: SlotEntry) -> int:
    """Newer than anything there: the copy is the newest snapshot of its place."""
    return max([entry.generation, *(e.generation + 1 for e in manifest.slots)])
