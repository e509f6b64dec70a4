"""The in-memory checkpoint tier: a rank's snapshots in its node agent's shared memory.

A snapshot copies the live tensors' bytes straight into a preallocated slot file on tmpfs
(one copy: the least a snapshot can block the loop); a background thread then checksums
the bytes and commits the slot in the manifest. The region outlives the worker: a worker
restarted on the same node loads from it instead of storage, and the agent persists it to
storage when a worker dies (checkpoint/persist.py). Layout and rules: memory_format.py.

Tree encoding (JSON, no pickle): a tensor is {"__t": i}, a tuple {"__tuple": [...]}, a dict
{"__d": [[key, value], ...]} (keys keep their type: optimizers key their state by int).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import mmap
import os
import threading
import zlib
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from trainguard.checkpoint.errors import CheckpointError
from trainguard.checkpoint.memory_format import (
    ALIGN,
    PINNED_SLOTS,
    SLOTS,
    MemoryManifest,
    SlotEntry,
    close_slot_bytes,
    free_slot,
    loadable,
    not_private,
    open_file,
    open_slot_bytes,
    rank_dir,
    read_manifest,
    read_pin,
    slot_path,
    write_manifest,
)
from trainguard.checkpoint.state import PLAIN

log = logging.getLogger(__name__)

GROW_STEP = 1 << 20  # slot files grow in whole MiB


# -- the tree <-> (skeleton, tensors) ----------------------------------------------------------

def flatten(tree: Any, tensors: list[torch.Tensor], path: str = "") -> Any:
    """The JSON skeleton of `tree`; its tensors appended to `tensors` in order."""
    if isinstance(tree, torch.Tensor):
        tensors.append(tree.detach())
        return {"__t": len(tensors) - 1}
    if isinstance(tree, PLAIN):
        return tree
    if isinstance(tree, Mapping):
        return {"__d": [[k if isinstance(k, PLAIN) else _bad(f"{path} key", k),
                         flatten(v, tensors, f"{path}/{k}")] for k, v in tree.items()]}
    if isinstance(tree, list):
        return [flatten(v, tensors, f"{path}/{i}") for i, v in enumerate(tree)]
    if isinstance(tree, tuple):
        return {"__tuple": [flatten(v, tensors, f"{path}/{i}") for i, v in enumerate(tree)]}
    return _bad(path, tree)


def _bad(path: str, value: Any) -> Any:
    raise CheckpointError(
        f"cannot snapshot {path!r}: a {type(value).__name__} is not plain data. Fix: keep "
        "state to tensors, numbers, strings, lists and dicts (or objects with state_dict())")


def unflatten(skeleton: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(skeleton, list):
        return [unflatten(v, tensors) for v in skeleton]
    if isinstance(skeleton, dict):
        if "__t" in skeleton:
            return tensors[int(skeleton["__t"])]
        if "__tuple" in skeleton:
            return tuple(unflatten(v, tensors) for v in skeleton["__tuple"])
        return {k: unflatten(v, tensors) for k, v in skeleton["__d"]}
    return skeleton


def layout(tensors: list[torch.Tensor]) -> tuple[list[dict[str, Any]], int]:
    """Each tensor's place in a slot (aligned), and the bytes the slot needs."""
    out, off = [], 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        out.append({"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                    "offset": off, "nbytes": nbytes})
        off += -(-nbytes // ALIGN) * ALIGN
    return out, off


def _dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dt


def view_tensor(buf: torch.Tensor, spec: dict[str, Any]) -> torch.Tensor:
    """Tensor `spec` of a slot, as a view of the slot's bytes `buf` (uint8)."""
    off, n = int(spec["offset"]), int(spec["nbytes"])
    raw = buf[off:off + n]
    if raw.numel() != n:
        raise ValueError("a tensor lies beyond the end of its slot")
    return raw.view(_dtype(spec["dtype"])).view(spec["shape"])


# -- one rank's slots ----------------------------------------------------------------------------

@dataclass
class _Slot:
    fd: int
    map: mmap.mmap | None = None
    size: int = 0  # bytes allocated (and mapped)
    buf: torch.Tensor | None = None  # uint8 over the map


def read_entry(region: str | os.PathLike[str], rank: int, entry: SlotEntry,
               lock: bool = False) -> Any:
    """A committed snapshot's tree, its tensors copied out of shared memory."""
    view, handle = open_slot_bytes(region, rank, entry, lock)
    try:
        if entry.size:
            buf = torch.frombuffer(view, dtype=torch.uint8)
            tensors = [view_tensor(buf, s).clone() for s in entry.tensors]
            del buf
        else:
            tensors = [torch.empty(s["shape"], dtype=_dtype(s["dtype"])) for s in entry.tensors]
        return unflatten(entry.tree, tensors)
    finally:
        view.release()
        close_slot_bytes(handle)


class RankSlots:
    """A rank's double-buffered snapshots in `region` (made by its node agent)."""

    def __init__(self, region: str | os.PathLike[str], rank: int, world_size: int,
                 run_id: str, keep: int = 3, pinned: bool = False) -> None:
        self.region, self.rank, self.world_size, self.run_id = (
            Path(region), rank, world_size, run_id)
        for d, make in ((Path(region), False), (rank_dir(region, rank), True)):
            if make:
                d.mkdir(mode=0o700, exist_ok=True)
            why = not_private(d)  # another user's, or a symlink: never written through
            if why is not None:
                raise CheckpointError(
                    f"memory snapshots refused: {why}. Fix: launch with `trainguard run "
                    f"--memory-every N` (the agent makes a private region), or remove {d}")
        self._manifest = read_manifest(region, rank) or MemoryManifest(rank)
        self._manifest.keep = keep
        newest = self._manifest.newest()
        self._generation = newest.generation if newest is not None else 0
        self._slots: dict[int, _Slot] = {}
        self._commit: Future[None] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._mutex = threading.Lock()  # the manifest, between the loop and the commit
        self.last_step: int | None = None
        self.checked_space = False
        self.pinned = pinned  # peer copies: two more slots keep the steps copied to peers
        self._slot_ids = PINNED_SLOTS if pinned else SLOTS

    # -- writing --------------------------------------------------------------------------

    def snapshot(self, step: int, tree: Any) -> bool:
        """Copy `tree` into the free slot and commit it; its CRC-32 is added in the
        background. False: skipped (the slot is being persisted by the agent)."""
        self.wait()
        tensors: list[torch.Tensor] = []
        skeleton = flatten(tree, tensors)
        specs, size = layout(tensors)
        with self._mutex:
            target = free_slot(self._manifest, self._slot_ids,
                               read_pin(self.region, self.rank) if self.pinned else ())
        slot = self._open(target)
        try:
            fcntl.flock(slot.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("memory snapshot of step %s skipped: its slot is being persisted", step)
            return False
        try:
            with self._mutex:  # from now on the slot holds no whole snapshot
                self._manifest = self._manifest.without(target)
                write_manifest(self.region, self._manifest)
            for n in self._slot_ids:  # all at once: no later snapshot pays for allocation
                self._reserve(self._open(n), size)
            buf = slot.buf
            for t, spec in zip(tensors, specs, strict=True):
                if buf is not None and spec["nbytes"]:
                    view_tensor(buf, spec).copy_(t)
            if any(t.is_cuda for t in tensors):
                torch.cuda.synchronize()
            self._generation += 1
            entry = SlotEntry(slot=target, step=step, generation=self._generation, size=size,
                              crc32=None, tree=skeleton, tensors=specs,
                              world_size=self.world_size, run_id=self.run_id)
            with self._mutex:  # committed: the copy is whole (its CRC follows)
                self._manifest = self._manifest.with_entry(entry)
                write_manifest(self.region, self._manifest)
            self.last_step = step
        finally:
            fcntl.flock(slot.fd, fcntl.LOCK_UN)
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="trainguard-memory")
        self._commit = self._executor.submit(self._checksum, slot, entry)
        return True

    def _checksum(self, slot: _Slot, entry: SlotEntry) -> None:
        """Add the snapshot's CRC-32 to its manifest entry (off the loop: the copy is the
        only part a snapshot blocks training for)."""
        crc = zlib.crc32(memoryview(slot.map)[:entry.size]) if slot.map is not None else 0
        with self._mutex:
            if any(s.generation == entry.generation for s in self._manifest.slots):
                self._manifest = self._manifest.with_entry(replace(entry, crc32=crc))
                write_manifest(self.region, self._manifest)

    def _open(self, n: int) -> _Slot:
        slot = self._slots.get(n)
        if slot is None:
            fd = open_file(slot_path(self.region, self.rank, n), os.O_RDWR | os.O_CREAT)
            slot = self._slots[n] = _Slot(fd)
        return slot

    def _reserve(self, slot: _Slot, size: int) -> None:
        """Make the slot hold `size` bytes: allocated now, so a full /dev/shm is an error
        here and never a SIGBUS in the middle of a copy."""
        if size <= slot.size:
            return
        if not self.checked_space:
            self._check_space(size)
        # a slot file a previous worker of this rank allocated is reused as it is
        had = os.fstat(slot.fd).st_size  # bytes a snapshot may still live in: kept as is
        want = max(-(-size // GROW_STEP) * GROW_STEP, had)
        if slot.map is not None:
            slot.buf = None
            slot.map.close()
            slot.map = None
        try:
            os.posix_fallocate(slot.fd, 0, want)
        except OSError as e:
            slot.size = 0
            raise CheckpointError(
                f"no room for a {size / 2**20:.1f} MiB memory snapshot ({e.strerror}). Fix: "
                f"docker run --shm-size (a larger {self.region.parent}), or --memory-every 0"
                ) from e
        slot.map = mmap.mmap(slot.fd, want)
        slot.size = want
        slot.buf = torch.frombuffer(slot.map, dtype=torch.uint8)
        slot.buf[had:].zero_()  # touch the new pages now, not during the first copy

    def _check_space(self, size: int) -> None:
        """The pre-check: room for both slots of a snapshot of this size."""
        st = os.statvfs(self.region)
        allocated = sum(os.fstat(self._open(n).fd).st_size for n in self._slot_ids)
        free = st.f_bavail * st.f_frsize + allocated
        n = len(self._slot_ids)
        if free < n * size:
            raise CheckpointError(
                f"memory snapshots need {n * size / 2**20:.1f} MiB of shared memory ({n} "
                f"slots of {size / 2**20:.1f} MiB), {free / 2**20:.1f} MiB free. Fix: docker "
                f"run --shm-size (a larger {self.region.parent}), or --memory-every 0")
        self.checked_space = True

    def wait(self) -> None:
        """The commit in flight, finished (its failure raised here)."""
        fut, self._commit = self._commit, None
        if fut is not None:
            fut.result()

    # -- reading --------------------------------------------------------------------------

    def valid(self) -> dict[int, SlotEntry]:
        """Snapshots this rank can load, by step: of this run and world size, bytes whole."""
        self.wait()
        return loadable(self.region, self.rank, self.world_size, self.run_id)

    def read(self, entry: SlotEntry) -> Any:
        return read_entry(self.region, self.rank, entry)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.wait()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        for slot in self._slots.values():
            slot.buf = None
            if slot.map is not None:
                with contextlib.suppress(BufferError):
                    slot.map.close()
            os.close(slot.fd)
        self._slots.clear()
