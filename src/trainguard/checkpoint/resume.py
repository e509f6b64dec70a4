"""Resume: load the newest valid checkpoint into a script's state objects, from the memory
tier (this rank's or a peer's snapshot) when it is newer than storage's, else from storage;
the RESUMED (or NO_CHECKPOINT) event says which. The Checkpointer's loading side."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from trainguard.checkpoint.errors import CheckpointError
from trainguard.checkpoint.loading import agree, load_newest, newest_valid_step
from trainguard.checkpoint.manifest import Verdict, step_dir
from trainguard.checkpoint.memory_tier import MemoryTier
from trainguard.checkpoint.sharded import KEYS as SHARDED_KEYS
from trainguard.checkpoint.sharded import load_sharded
from trainguard.checkpoint.state import RNG_KEY, apply, restore_rng
from trainguard.checkpoint.storage import Storage
from trainguard.worker import channel
from trainguard.worker.contract import (
    SOURCE_MEMORY,
    SOURCE_PEER,
    SOURCE_STORAGE,
    MessageKind,
)

log = logging.getLogger("trainguard.checkpoint.checkpointer")  # the Checkpointer's lines


def resume(storage: Storage, state: Mapping[str, Any], rank: int, world_size: int,
           memory: MemoryTier | None, report: Callable[[Verdict, bool], None],
           ) -> tuple[int | None, bool]:
    """Load into `state`; (the step loaded or None, whether storage holds it: loaded from
    there, or from memory at the step of storage's newest valid checkpoint)."""
    try:  # a store that cannot be reached is said as such, not as a library's traceback
        steps = storage.steps()  # listed once (a request on object storage)
    except Exception as e:
        raise CheckpointError(
            f"cannot list the checkpoints at {storage.location}: "
            f"{type(e).__name__}: {e}. Fix: check that the storage is reachable and the "
            "credentials are right; a restart retries it") from e
    if not steps:  # a bucket that does not exist is not "nothing saved yet" (F2)
        storage.check_bucket()
    if memory is not None:
        stored = newest_valid_step(storage, steps)
        step, tree, origin = memory.resume_step(stored)
        if step is not None:
            apply(state, tree["replicated"], "replicated")
            rng = tree["rank"].pop(RNG_KEY, None)
            apply(state, tree["rank"], "rank")
            if rng is not None:
                restore_rng(rng)
            channel.send(MessageKind.RESUMED, step=step, location=storage.location,
                         source=SOURCE_PEER if origin else SOURCE_MEMORY)
            return step, step == stored
    loaded = load_newest(storage, rank, partial(agree, rank, world_size), report, steps)
    if loaded is None:
        if rank == 0:
            channel.send(MessageKind.NO_CHECKPOINT, location=storage.location)
        return None, False
    apply(state, loaded.replicated, "replicated")
    load_sharded(storage, step_dir(loaded.step), state,
                 list(loaded.replicated.get(SHARDED_KEYS, [])))
    if loaded.per_rank is not None:
        rng = loaded.per_rank.pop(RNG_KEY, None)
        apply(state, loaded.per_rank, "rank")
        if rng is not None and loaded.borrowed_from is None:
            restore_rng(rng)
    own = loaded.borrowed_from is None and loaded.per_rank is not None
    if not own:
        log.warning("checkpoint step %s has no part of rank %s (see its Resumed event):"
                    " data position from rank %s, fresh RNG",
                    loaded.step, rank, loaded.borrowed_from)
    channel.send(MessageKind.RESUMED, step=loaded.step, location=storage.location,
                 source=SOURCE_STORAGE, own_part=own, borrowed_from=loaded.borrowed_from)
    return loaded.step, True


def tell_skipped(bad_steps: set[int], location: str, verdict: Verdict, tell: bool) -> None:
    """A checkpoint a resume passed over: logged; remembered in `bad_steps` (re-saved when
    reached) unless misplaced (kept for the person to move back); told to the launcher by the
    lowest rank that failed, with its own reason (walk-through 22)."""
    if not verdict.misplaced:
        bad_steps.add(verdict.step)
    log.warning("skipping checkpoint step %s (%s): %s", verdict.step,
                verdict.status.value, verdict.reason)
    if tell:
        channel.send(MessageKind.CHECKPOINT_CORRUPT, step=verdict.step,
                     status=verdict.status.value, reason=verdict.reason, location=location)
