"""Find the newest valid checkpoint every rank can load, newest to oldest.

Each rank checks the manifest (its step must be its directory's), the sizes of every file,
and the SHA-256 of the files it reads (the replicated state and its own part); the DCP
shards under `sharded/` are all checked, split across the ranks, since under a world-size
change a rank reads other ranks' shards. With torch.distributed initialised the ranks agree
(all-reduce of the verdicts) so they all load the same step. Loading uses
`torch.load(weights_only=True)`: no pickled code runs.

A read error of the storage (EIO, a timeout, a throttled object store) is not corruption:
it is tried again (RETRY_DELAYS), and when it lasts the resume stops with a CheckpointError
saying the storage cannot be read; the step is neither skipped nor marked bad. Only a
checksum or format failure makes a step corrupt.
"""

from __future__ import annotations

import hashlib
import io
import logging
import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, TypeVar

import torch

from trainguard.checkpoint.attempt import reduce_ints
from trainguard.checkpoint.errors import CheckpointError
from trainguard.checkpoint.manifest import (
    MANIFEST,
    REPLICATED,
    Manifest,
    Status,
    Verdict,
    rank_file,
    step_dir,
)
from trainguard.checkpoint.saving import quick_verdict
from trainguard.checkpoint.storage import Storage

log = logging.getLogger(__name__)

Agree = Callable[[bool], list[int]]  # this rank's "ok" -> the ranks that were not ok
Report = Callable[[Verdict, bool], None]  # a step skipped; True: this rank tells the job
T = TypeVar("T")

RETRY_DELAYS: tuple[float, ...] = (0.5, 2.0, 5.0)  # seconds before each new try of a read
# what a read raises when the bytes are wrong (checksum, format) or a listed file is gone
_CORRUPT = (ValueError, RuntimeError, EOFError, pickle.UnpicklingError, FileNotFoundError)


class Unreadable(CheckpointError):
    """The storage would not give a checkpoint's bytes, after every try: not corruption."""


@dataclass(frozen=True)
class Loaded:
    step: int
    replicated: dict[str, Any]
    per_rank: dict[str, Any] | None  # None: no rank's part at all
    manifest: Manifest
    borrowed_from: int | None = None  # this rank had no part: data positions from that rank


def agree(rank: int, world_size: int, ok: bool) -> list[int]:
    """The ranks that could not load the step (all-reduce of one flag per rank)."""
    flags = [0] * world_size
    flags[rank] = 0 if ok else 1
    return [r for r, bad in enumerate(reduce_ints(flags, "sum")) if bad]


def load_newest(st: Storage, rank: int, agree: Agree, report: Report,
                steps: list[int] | None = None) -> Loaded | None:
    """The newest step every rank could load (`steps`: the store's, newest first, when the
    caller listed them already; a listing is a request on object storage)."""
    for step in st.steps() if steps is None else steps:
        loaded: Loaded | None = None
        stuck: str | None = None  # the storage error that outlasted the retries
        verdict = Verdict(step, Status.CORRUPT)
        try:
            verdict, manifest = read_retried(f"{step_dir(step)}/{MANIFEST}",
                                             partial(quick_verdict, st, step))
            if verdict.status == Status.VALID and manifest is not None:
                loaded = _read(st, manifest, step, rank)
        except Unreadable as e:
            stuck = str(e)
        except _CORRUPT as e:
            # UnpicklingError: weights_only refused a pickled object (it never runs)
            verdict = Verdict(step, Status.CORRUPT, f"{type(e).__name__}: {e}"[:300])
        failed = agree(loaded is not None)
        if failed:
            # a second vote, only when a rank failed (every rank sees the same `failed`):
            # the "not ok" ranks of agree(stuck) are those whose storage answered
            answered = set(agree(stuck is not None))
            if unread := [r for r in failed if r not in answered]:
                raise CheckpointError(_unreadable(st, step, unread, stuck))
            if loaded is not None:
                verdict = Verdict(step, Status.CORRUPT,
                                  f"rank {_ranks(failed)} could not load it")
            elif len(failed) > 1:
                verdict = replace(verdict, reason=f"{verdict.reason} (rank "
                                  f"{_ranks(failed)} could not load it)"[:400])
            report(verdict, rank == failed[0])  # the lowest that failed tells its own why
            continue
        return loaded
    return None


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))


def _unreadable(st: Storage, step: int, ranks: list[int], stuck: str | None) -> str:
    what = stuck or f"rank {_ranks(ranks)} could not read it (its log says why)"
    return (f"cannot read the checkpoint of step {step} at {st.location}: {what}. This is a "
            f"storage error, not corruption ({len(RETRY_DELAYS) + 1} tries): the step is not "
            "skipped. Fix: check the storage (disk, mount, object store reachability, "
            "credentials, throttling); a restart retries it. If the files of "
            f"{step_dir(step)} stay unreadable, delete that directory to resume from the "
            "checkpoint before it")


def read_retried(what: str, read: Callable[[], T]) -> T:
    """`read()`, tried again after a storage error; Unreadable when it lasts. Wrong bytes
    (checksum, format) and a missing file are raised at once: trying again cannot help.
    Every read of a resume goes through it (DCP's shard reads too: sharded.py)."""
    for delay in (*RETRY_DELAYS, None):
        try:
            return read()
        except _CORRUPT:
            raise
        except Exception as e:  # OSError (EIO, ESTALE, EBUSY: throttled), timeouts, HTTP
            if delay is None:
                raise Unreadable(f"reading {what} failed: {type(e).__name__}: {e}"[:400]
                                 ) from e
            log.warning("reading %s failed (%s: %s): trying again in %.1f s",
                        what, type(e).__name__, e, delay)
            time.sleep(delay)
    raise AssertionError("unreachable")


def newest_valid_step(st: Storage, steps: list[int] | None = None) -> int | None:
    """The newest step whose manifest and file sizes are right (checksums: on load)."""
    found = newest_valid(st, steps)
    return None if found is None else found[0]


def newest_valid(st: Storage, steps: list[int] | None = None,
                 accept: Callable[[Manifest], bool] = lambda _m: True,
                 ) -> tuple[int, Manifest] | None:
    """The newest step (of `steps`, newest first; default all) whose manifest and file sizes
    are right and whose manifest `accept`s, with its manifest."""
    for step in st.steps() if steps is None else steps:
        what = f"{step_dir(step)}/{MANIFEST}"
        verdict, manifest = read_retried(what, partial(quick_verdict, st, step))
        if verdict.status == Status.VALID and manifest is not None and accept(manifest):
            return step, manifest
    return None


def _world() -> int:
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return int(dist.get_world_size())
    return 1  # alone: this rank checks every shard


def _read(st: Storage, manifest: Manifest, step: int, rank: int) -> Loaded:
    d = step_dir(step)
    replicated = _load(st, manifest, d, REPLICATED)
    # DCP's shards (DCP checks no checksum): under a world-size change a rank reads other
    # ranks' shards (2 saved, 1 resumes: rank 0 reads __1_0.distcp; walk-through 31 #6), so
    # every shard is checked, each by one rank of this world (its own when the world is the
    # same); agree() makes one rank's failure every rank's
    world = _world()
    for f in manifest.files:
        if ("/" in f.name and f.rank % world == rank % world
                and read_retried(f.name, partial(st.sha256, f"{d}/{f.name}")) != f.sha256):
            raise ValueError(f"{f.name}: checksum differs from the manifest")
    if manifest.entry(rank_file(rank)) is not None:
        return Loaded(step, replicated, _load(st, manifest, d, rank_file(rank)), manifest)
    # No part of ours (we died before the exit save, or the world grew): data positions of
    # data-parallel ranks advance together, so the lowest rank's are ours; RNG starts fresh.
    donors = sorted(f.rank for f in manifest.files if f.name == rank_file(f.rank))
    if not donors:
        return Loaded(step, replicated, None, manifest)
    part = _load(st, manifest, d, rank_file(donors[0]))
    return Loaded(step, replicated, part, manifest, borrowed_from=donors[0])


def _load(st: Storage, manifest: Manifest, d: str, name: str) -> dict[str, Any]:
    entry = manifest.entry(name)
    if entry is None:
        raise ValueError(f"{name} is not in the manifest")
    rel = f"{d}/{name}"
    local = st.local_path(rel)
    if local is not None:  # hash by streaming, then map the file: no second copy in memory
        if read_retried(rel, partial(st.sha256, rel)) != entry.sha256:
            raise ValueError(f"{name}: checksum differs from the manifest")
        obj = read_retried(rel, partial(torch.load, local, map_location="cpu",
                                        weights_only=True, mmap=True))
    else:
        data = read_retried(rel, partial(st.read_bytes, rel))
        if hashlib.sha256(data).hexdigest() != entry.sha256:
            raise ValueError(f"{name}: checksum differs from the manifest")
        obj = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    if not isinstance(obj, dict):
        raise ValueError(f"{name} does not hold a state dict")
    return obj
