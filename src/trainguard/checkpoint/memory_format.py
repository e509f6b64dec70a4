"""The in-memory checkpoint tier's layout on disk (tmpfs): names, manifest, rules. Stdlib only.

The node agent owns one region per node (a directory under /dev/shm, made before its
workers start, freed when the job ends however it ends); each rank writes its snapshots in
its own subdirectory:

    <region>/rank-R/slot-0.bin   raw tensor bytes of one snapshot (posix_fallocate'd: a full
    <region>/rank-R/slot-1.bin   /dev/shm is an error at allocation, never a SIGBUS later)
    <region>/rank-R/manifest.json   the slots that hold a whole snapshot: step, generation,
                                  size, CRC-32 of the bytes, and the tree (plain values
                                  inline, tensors as dtype, shape, offset) - no pickle

Double buffering: a snapshot is written into the slot the manifest does not name as the
newest, after the manifest stopped naming that slot at all; the manifest naming it again
(atomic rename) commits it. A crash at any moment leaves the other slot whole.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

FORMAT = 1
MANIFEST = "manifest.json"
SLOTS = (0, 1)
ALIGN = 64  # every tensor starts on a cache line
DEFAULT_ROOT = "/dev/shm"
REGION_PREFIX = "trainguard-"


@dataclass(frozen=True)
class SlotEntry:
    slot: int
    step: int
    generation: int  # counts snapshots of the rank over the job: the newer of two is higher
    size: int  # bytes used in the slot file
    crc32: int | None  # of those bytes; None for a moment after the copy (added after)
    tree: Any  # the skeleton: plain values, {"__t": i} for tensor i, {"__d": [[k, v]...]}...
    tensors: list[dict[str, Any]]  # {"dtype", "shape", "offset", "nbytes"}
    world_size: int
    run_id: str


@dataclass
class MemoryManifest:
    rank: int
    slots: list[SlotEntry] = field(default_factory=list)
    format: int = FORMAT

    def newest(self) -> SlotEntry | None:
        return max(self.slots, key=lambda s: s.generation, default=None)

    def without(self, slot: int) -> MemoryManifest:
        return MemoryManifest(self.rank, [s for s in self.slots if s.slot != slot])

    def with_entry(self, entry: SlotEntry) -> MemoryManifest:
        return MemoryManifest(self.rank, [*self.without(entry.slot).slots, entry])

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> MemoryManifest:
        d = json.loads(raw)
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ValueError(f"not a memory snapshot manifest of format {FORMAT}")
        slots = [SlotEntry(**s) for s in d["slots"]]
        if any(s.slot not in SLOTS for s in slots) or len({s.slot for s in slots}) != len(slots):
            raise ValueError("the manifest names a slot twice or a slot that does not exist")
        return cls(int(d["rank"]), slots)


def rank_dir(region: str | os.PathLike[str], rank: int) -> Path:
    return Path(region) / f"rank-{rank}"


def slot_path(region: str | os.PathLike[str], rank: int, slot: int) -> Path:
    return rank_dir(region, rank) / f"slot-{slot}.bin"


def read_manifest(region: str | os.PathLike[str], rank: int) -> MemoryManifest | None:
    """The rank's manifest, or None when there is none or it is unreadable (no snapshot)."""
    try:
        return MemoryManifest.from_json((rank_dir(region, rank) / MANIFEST).read_bytes())
    except (OSError, ValueError, TypeError, KeyError):
        return None


def write_manifest(region: str | os.PathLike[str], manifest: MemoryManifest) -> None:
    """Replace the manifest atomically (tmpfs: a rename is the commit; nothing to fsync)."""
    d = rank_dir(region, manifest.rank)
    tmp = d / f".{MANIFEST}.{os.getpid()}.tmp"
    tmp.write_bytes(manifest.to_json())
    os.replace(tmp, d / MANIFEST)


def agreed_step(per_rank: Sequence[Iterable[int]]) -> int | None:
    """The newest step every rank holds (each rank lists the steps it can load), or None."""
    sets = [set(s) for s in per_rank]
    if not sets:
        return None
    common = set.intersection(*sets)
    return max(common) if common else None


def region_path(root: str, marker: str, node: str) -> Path:
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in f"{marker}-{node}")
    return Path(root) / f"{REGION_PREFIX}{safe}"


def free_region(path: str | os.PathLike[str]) -> None:
    """Remove a region and everything in it; quietly when it is already gone."""
    import shutil

    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(path)


def memory_resume_step(per_rank_steps: Sequence[Iterable[int]],
                       per_rank_storage: Sequence[int | None]) -> int | None:
    """The step to resume from memory, or None (storage): the newest step every rank holds
    in memory, when no rank sees a newer valid checkpoint in storage."""
    in_memory = agreed_step(per_rank_steps)
    stored = max((s for s in per_rank_storage if s is not None), default=None)
    if in_memory is None or (stored is not None and stored > in_memory):
        return None
    return in_memory
