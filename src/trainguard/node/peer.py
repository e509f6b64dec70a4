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
  manifest entry, with the node it came from as `origin`;
- `tails` gives, for each rank whose newest whole snapshot is newer than the controller's,
  that snapshot's manifest entry and the bytes of its small tensors (RNG states, counters:
  what differs between the ranks of a data-parallel job): with a survivor's snapshot of
  the same step, enough to rebuild a lost rank's newest step (`store` with a `patch`, the
  whole CRC-32 checked against the lost rank's own).

Standard library only: the agent never imports torch.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import fcntl
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from trainguard.checkpoint.memory_format import (
    MANIFEST,
    SLOTS,
    MemoryManifest,
    SlotEntry,
    close_slot_bytes,
    free_slot,
    make_private,
    not_private,
    open_file,
    open_slot_bytes,
    rank_dir,
    read_manifest,
    slot_path,
    write_manifest,
    write_pin,
)

PEER = "peer"  # the copies a node keeps for its neighbour, in its region
CHUNK_BYTES = 16 << 20  # per command: under the wire's 64 MiB frame once in base64
SMALL_TENSOR_BYTES = 16 << 10  # a tail carries the bytes of tensors up to this size...
TAIL_BYTES = 1 << 20  # ...up to this much per rank (else the rank has no tail)


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


def entries(region: Path) -> dict[int, list[dict[str, Any]]]:
    """Per rank of this node, the manifest entries of its whole snapshots."""
    return {r: [dict(vars(e)) for e in whole(region, r)] for r in ranks_in(region)}


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
    return {"rank": rank, "entry": dict(vars(e)), "offset": offset, "total": e.size,
            "length": len(data), "data": base64.b64encode(data).decode("ascii")}


def tails(region: Path, have: dict[int, int], only: list[int] | None = None
          ) -> dict[int, dict[str, Any]]:
    """Per rank of this node whose newest whole snapshot is of a newer generation than
    `have` names: its entry and its small tensors' bytes ({"entry", "small": [[index,
    base64], ...]}); `only`: of those tensors alone (the ones that differ between ranks).
    A rank whose small tensors exceed TAIL_BYTES has none."""
    out: dict[int, dict[str, Any]] = {}
    wanted = set(only) if only is not None else None
    for rank in ranks_in(region):
        e = _newest_whole(region, rank)
        if e is None or e.generation <= have.get(rank, -1):
            continue
        small = [(i, t) for i, t in enumerate(e.tensors)
                 if 0 < int(t["nbytes"]) <= SMALL_TENSOR_BYTES
                 and (wanted is None or i in wanted)]
        if sum(int(t["nbytes"]) for _, t in small) > TAIL_BYTES:
            continue
        try:  # no CRC pass here: the entry's CRC checks the rebuilt snapshot as a whole
            view, handle = open_slot_bytes(region, rank, e, lock=True, check=False)
        except (OSError, ValueError):
            continue  # being overwritten: the next call has the newer one
        try:
            parts = [[i, base64.b64encode(bytes(view[int(t["offset"]):int(t["offset"])
                                                       + int(t["nbytes"])])).decode("ascii")]
                     for i, t in small]
        finally:
            view.release()
            close_slot_bytes(handle)
        out[rank] = {"entry": dict(vars(e)), "small": parts}  # no deep copy
    return out


_NEWEST: dict[Path, tuple[tuple[int, int, int], SlotEntry | None]] = {}


def _newest_whole(region: Path, rank: int) -> SlotEntry | None:
    """The rank's newest whole snapshot; its manifest parsed again only when the file
    changed (the controller asks every 20 ms; a step writes the manifest three times)."""
    path = rank_dir(region, rank) / MANIFEST
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (st.st_ino, st.st_mtime_ns, st.st_size)
    hit = _NEWEST.get(path)
    if hit is not None and hit[0] == key:
        return hit[1]
    e = max(whole(region, rank), key=lambda x: x.generation, default=None)
    if len(_NEWEST) > 1024:
        _NEWEST.clear()
    _NEWEST[path] = (key, e)
    return e


def store(region: Path, peer: bool, body: dict[str, Any], origin: str) -> bool:
    """Write one chunk; True once the snapshot is whole and committed. The last chunk may
    carry a `patch` ([[index, base64], ...]: tensors of the entry to overwrite before the
    CRC-32 check): a lost rank's snapshot rebuilt from another rank's bytes."""
    base = where(region, peer)
    rank, offset = int(body["rank"]), int(body["offset"])
    entry = SlotEntry(**body["entry"])
    data = base64.b64decode(body["data"])
    own_region(region)
    for d in [base, rank_dir(base, rank)] if peer else [rank_dir(base, rank)]:
        d.mkdir(mode=0o700, exist_ok=True)
        _private(d)
    manifest = read_manifest(base, rank) or MemoryManifest(rank)
    target = _target(manifest, entry)
    if offset == 0:  # a new copy: its slot holds no whole snapshot from now on
        manifest = manifest.without(target)
        write_manifest(base, manifest)
    fd = open_file(slot_path(base, rank, target), os.O_RDWR | os.O_CREAT)  # no symlink (#8)
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
    _apply(slot_path(base, rank, target), entry, body.get("patch") or [])
    copied = replace(entry, slot=target, origin=entry.origin or origin,
                     generation=_generation(manifest, entry))
    view, handle = open_slot_bytes(base, rank, copied)  # raises when the CRC-32 differs
    view.release()
    close_slot_bytes(handle)
    write_manifest(base, manifest.with_entry(copied))
    return True


def own_region(region: Path) -> None:
    """Make the region when it is not there yet (a restore onto a spare comes before its
    first workers start, which is when the agent makes it: the agent then takes this one,
    MemoryRegion.ensure); OSError unless it is this user's and private. Never a parent of
    it, nor one someone else made (review of walk-through 32 #5: `mkdir(parents=True)`
    made it here, 0755, and the agent then refused it as not its own)."""
    if not os.path.lexists(region):
        make_private(region)
    _private(region)


def _private(path: Path) -> None:
    """OSError unless `path` is a dir of this user's alone (not a symlink put in its place:
    review of walk-through 32 #8)."""
    why = not_private(path)
    if why is not None:
        raise OSError(errno.EPERM, f"{why}: no peer copy is written there")


def _apply(path: Path, entry: SlotEntry, patch: list[Any]) -> None:
    fd = open_file(path, os.O_RDWR)
    try:
        for index, b64 in patch:
            spec = entry.tensors[int(index)]
            data = base64.b64decode(b64)
            if len(data) != int(spec["nbytes"]):
                raise ValueError(f"the patch of tensor {index} has {len(data)} bytes, not "
                                 f"{spec['nbytes']}")
            os.pwrite(fd, data, int(spec["offset"]))
    finally:
        os.close(fd)


def _target(manifest: MemoryManifest, entry: SlotEntry) -> int:
    """The slot a copy goes into: the one not holding the newest (a later chunk of the same
    copy finds the same: the first dropped it from the manifest)."""
    return free_slot(manifest, SLOTS)


def _generation(manifest: MemoryManifest, entry: SlotEntry) -> int:
    """Newer than anything there: the copy is the newest snapshot of its place."""
    return max([entry.generation, *(e.generation + 1 for e in manifest.slots)])
