"""When the Checkpointer uses memory snapshots, and whether a resume comes from one.

On under the launcher when `memory_every` > 0 (`Checkpointer(memory_every=N)`, or
`trainguard run --memory-every N`): the agent made the region (TRAINGUARD_MEMORY_DIR).

Resuming: every rank lists the snapshot steps it can load (bytes checked) and the newest
valid step in storage; the ranks agree on the newest step every rank holds in memory, and
use it when it is at least as new as storage's. The agreement goes through the launcher's
controller (no process group needed: a script may load before init_process_group), or an
all-gather when a process group exists and the launcher is absent.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from trainguard.checkpoint.errors import CheckpointError
from trainguard.checkpoint.memory import RankSlots
from trainguard.checkpoint.memory_format import memory_resume_step
from trainguard.checkpoint.snapshot_timing import SnapshotTimer
from trainguard.checkpoint.state import capture_rng, split
from trainguard.worker import channel, control
from trainguard.worker.contract import (
    CHECKPOINT_PHASE,
    ENV_ATTEMPT,
    ENV_MEMORY_DIR,
    ENV_MEMORY_EVERY,
    ENV_MEMORY_PEER,
    ENV_RUN_ID,
    ControlKind,
    MessageKind,
)
from trainguard.worker.progress import phase

log = logging.getLogger(__name__)

AGREE_TIMEOUT_S = 120.0  # a rank's wait for every rank's list (they start within seconds)


def memory_every_from_env(explicit: int | None) -> int:
    if explicit is not None:
        if explicit < 0:
            raise CheckpointError("memory_every must be >= 0 (0: no memory snapshots)")
        return explicit
    raw = os.environ.get(ENV_MEMORY_EVERY, "0")
    return int(raw) if raw.isdigit() else 0


class MemoryTier:
    """The Checkpointer's memory snapshots (None of this runs when they are off)."""

    def __init__(self, every: int, rank: int, world_size: int, keep: int) -> None:
        region = os.environ.get(ENV_MEMORY_DIR, "")
        if not region or not os.path.isdir(region):
            raise CheckpointError(
                f"memory snapshots need the shared-memory region the node agent makes "
                f"({ENV_MEMORY_DIR} is {'unset' if not region else 'not a directory'}). "
                "Fix: launch with `trainguard run --memory-every N` (or `memory_every: N` in "
                "the job file), or pass memory_every=0")
        self.every, self.rank, self.world_size = every, rank, world_size
        self.slots = RankSlots(region, rank, world_size, os.environ.get(ENV_RUN_ID, ""), keep,
                               pinned=os.environ.get(ENV_MEMORY_PEER) == "1")
        self._off_reason: str | None = None
        self._failures = 0  # snapshots skipped in a row (OSError after the first)
        self._timer = SnapshotTimer(rank)  # rank 0: the loop's blocking, to the agent

    def maybe_snapshot(self, step: int, state: Mapping[str, Any]) -> bool:
        """Called by maybe_save every `every` steps; timed from here to the commit: all of
        it holds the training loop."""
        if self._off_reason is not None:
            return False
        with self._timer.timed(step), phase(CHECKPOINT_PHASE):  # its own hang allowance
            done = self._snapshot(step, state, capture_rng())
        if done:  # the step is reached: liveness for a rank that reports no steps itself
            channel.send(MessageKind.SNAPSHOT_TAKEN, step=step)  # (walk-through 40 #2)
        return done

    def _snapshot(self, step: int, state: Mapping[str, Any], rng: dict[str, Any]) -> bool:
        replicated, per_rank, sharded = split(state)
        if sharded:
            self._off_reason = (f"{sorted(sharded)} hold sharded (DTensor) state, which "
                                "memory snapshots do not cover")
            log.warning("memory snapshots off: %s", self._off_reason)
            return False
        per_rank["__rng__"] = rng
        try:
            done = self.slots.snapshot(step, {"replicated": replicated, "rank": per_rank})
        except (OSError, CheckpointError) as e:
            if self.slots.last_step is None:  # the first: the set-up is wrong, say so now
                if isinstance(e, CheckpointError):
                    raise
                raise CheckpointError(f"cannot write a memory snapshot: {e}. Fix: check "
                                      "/dev/shm, or --memory-every 0") from e
            self._failures += 1  # later (a /dev/shm that filled up): training goes on
            if self._failures == 1:
                control.say("memory", f"memory snapshot of step {step} skipped ({e}); the "
                            f"snapshot of step {self.slots.last_step} stays loadable")
            return False
        self._failures = 0
        return done

    def resume_step(self, storage_step: int | None) -> tuple[int | None, Any, str]:
        """The step every rank resumes from memory, with this rank's snapshot tree and the
        node its copy came from ("": its own); or (None, None, ""): resume from storage."""
        valid = self.slots.valid()
        step = self._agree(sorted(valid), storage_step)
        if step is None:
            return None, None, ""
        return step, self.slots.read(valid[step]), valid[step].origin

    def _agree(self, steps: list[int], storage_step: int | None) -> int | None:
        if self.world_size == 1:
            return memory_resume_step([steps], [storage_step])
        dist = torch.distributed
        inbox = control.inbox()
        if inbox is not None:
            return _agree_through_controller(inbox, steps, storage_step)
        if dist.is_available() and dist.is_initialized():
            box: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(box, [steps, storage_step])
            return memory_resume_step([b[0] for b in box], [b[1] for b in box])
        log.warning("memory snapshots not used to resume: no launcher and no process group "
                    "to agree on a step with")
        return None

    def close(self) -> None:
        self._timer.close()  # the blocking not reported yet goes now
        self.slots.close()


def _agree_through_controller(inbox: control.Inbox, steps: Sequence[int],
                              storage_step: int | None) -> int | None:
    attempt = int(os.environ.get(ENV_ATTEMPT, "0") or 0)
    generation = control.pg_generation()

    def ask() -> None:
        channel.send(MessageKind.MEMORY_STEPS, steps=list(steps), storage_step=storage_step,
                     attempt=attempt, generation=generation)

    verdict = inbox.wait(lambda v: v["kind"] == ControlKind.RESUME_FROM
                         and v.get("attempt") == attempt and v.get("generation") == generation,
                         AGREE_TIMEOUT_S, tick=ask)
    if verdict is None:
        raise CheckpointError(
            f"no answer from the launcher on which step to resume from within "
            f"{AGREE_TIMEOUT_S:g}s (every rank must call load_latest). Fix: call "
            "load_latest on every rank, or pass memory_every=0")
    step = verdict.get("step")
    return int(step) if step is not None else None
