"""Checkpointer: exact, validated, asynchronous checkpoints for a training script.

    ckpt = Checkpointer()                       # location: TRAINGUARD_CHECKPOINT_DIR
    state = {"model": model, "optimizer": opt, "scheduler": sched, "sampler": sampler}
    start = ckpt.load_latest(state) or 0        # newest valid checkpoint, loaded in place
    for step in range(start + 1, steps + 1):
        ...
        ckpt.maybe_save(step, state)            # every `every_steps`, in the background
    ckpt.close()

The loop blocks only while the state is copied to host memory; writing happens on one
background thread, at most one save in flight (the next save waits for it, or is
skipped with `if_busy="skip"`). A failed save is reported and retried at the next save;
`max_consecutive_failures` failed saves in a row raise CheckpointError in the loop.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from typing import Any, Literal

from trainguard import __version__
from trainguard.checkpoint.attempt import job_run_id, rank_and_world, reduce_ints, save_token
from trainguard.checkpoint.boundary import OwedStep
from trainguard.checkpoint.errors import CheckpointError
from trainguard.checkpoint.exit_save import ExitSaver, dead_ranks, enabled_by_env
from trainguard.checkpoint.listing import CheckpointInfo, list_checkpoints
from trainguard.checkpoint.memory_tier import MemoryTier, memory_every_from_env
from trainguard.checkpoint.resume import resume, tell_skipped
from trainguard.checkpoint.save_report import SaveReporter, last_save_lost, newest_kept
from trainguard.checkpoint.saving import SaveJob, SaveResult, run_save
from trainguard.checkpoint.sharded import save_sharded
from trainguard.checkpoint.state import RNG_KEY, BufferPool, capture_rng, split, stage
from trainguard.checkpoint.storage import Storage
from trainguard.worker.contract import (
    CHECKPOINT_PHASE,
    ENV_CHECKPOINT_DIR,
)
from trainguard.worker.imports import report_once as report_imports
from trainguard.worker.progress import phase
from trainguard.worker.resilient import on_restart, restart_if_asked

log = logging.getLogger(__name__)

_LAST_SAVE = "the last save (close()): no save follows; the rank ends with a CheckpointError"
_OWED = "close(): the step resumed from memory was in no storage"


class Checkpointer:
    def __init__(
        self,
        location: str | os.PathLike[str] | None = None,
        *,
        keep: int = 3,
        async_save: bool = True,
        every_steps: int | None = None,
        storage_options: dict[str, Any] | None = None,
        max_consecutive_failures: int = 3,
        commit_timeout_s: float = 300.0,
        if_busy: Literal["wait", "skip"] = "wait",
        save_on_exit: bool | None = None,
        memory_every: int | None = None,
    ) -> None:
        location = location if location is not None else os.environ.get(ENV_CHECKPOINT_DIR)
        if not location:
            raise CheckpointError(f"no checkpoint location. Fix: pass one, or run under "
                                  f"`trainguard run` (which sets {ENV_CHECKPOINT_DIR})")
        if keep < 1 or max_consecutive_failures < 1:
            raise CheckpointError("keep and max_consecutive_failures must be >= 1")
        self.storage = Storage(location, storage_options)
        self.keep, self.async_save, self.every_steps = keep, async_save, every_steps
        self.max_consecutive_failures = max_consecutive_failures
        self.commit_timeout_s, self.if_busy = commit_timeout_s, if_busy
        self.rank, self.world_size = rank_and_world()
        save_token()  # agree on the save token now, while every rank is here
        self._pool = BufferPool()
        self._executor: ThreadPoolExecutor | None = None
        self._pending: Future[SaveResult] | None = None
        self._lock = threading.Lock()
        self._failures = 0
        self._last_error: BaseException | None = None
        self._failed_step: int | None = None  # the step of the last save that failed
        self._closing = False  # close() waits for the last save: none follows it
        self._told_final = False  # the last failure's event said no save follows
        self._events = SaveReporter(self.storage.location, self.rank, max_consecutive_failures)
        self._pending_step: tuple[int, float] | None = None  # the save in flight, its start
        self._bad_steps: set[int] = set()  # found corrupt on load: re-saved when reached
        # skipped (if_busy="skip") at the newest step boundary: close() saves it (F10)
        self._skipped: tuple[int, Mapping[str, Any], dict[str, Any]] | None = None
        self._sharded = False  # the state has sharded (DCP) parts: known from the first save
        self._owed: OwedStep | None = None  # resumed from memory past storage's newest
        self.last_saved_step: int | None = None  # committed (rank 0), or found committed
        self.last_written_step: int | None = None  # this rank's part is durable (any rank)
        self.last_blocked_s: float | None = None
        on_exit = enabled_by_env() if save_on_exit is None else save_on_exit
        self._exit = ExitSaver(self) if on_exit else None
        self._abandoned = False
        every = memory_every_from_env(memory_every)
        self._memory = MemoryTier(every, self.rank, self.world_size, keep) if every else None
        on_restart(self.abandon)  # an in-process restart gives the save in flight up

    # -- saving ---------------------------------------------------------------------------

    def maybe_save(self, step: int, state: Mapping[str, Any]) -> bool:
        """Call after every step. Saves when `step` is a multiple of `every_steps` (True when
        a save was started); with save_on_exit, also marks the step boundary. Raises
        CheckpointError at the first step after the failed saves reached the limit (not at
        the next save: the steps until then could not be kept; walk-through 24)."""
        self._raise_if_failing()
        self._skipped = None  # a newer step boundary: the skipped state is gone
        if self._owed is not None:
            self._owed.boundary.mark(step, state)
        saves = bool(self.every_steps and step % self.every_steps == 0)
        if self._exit is not None:
            self._exit.step_done(step, state, saves)
        if self._memory is not None and step % self._memory.every == 0:
            self._memory.maybe_snapshot(step, state)  # timed: the loop's wait (rank 0's)
        return self._save(step, state) if saves else False

    def save(self, step: int, state: Mapping[str, Any]) -> bool:
        """Snapshot `state` at `step` and write it (in the background when async_save).

        Returns False when skipped because a save is still in flight (if_busy="skip").
        """
        self._skipped = None
        if self._owed is not None:
            self._owed.boundary.mark(step, state)
        if self._exit is not None:
            self._exit.step_done(step, state, True)  # a step boundary too
        return self._save(step, state)

    def _save(self, step: int, state: Mapping[str, Any],
              rng: dict[str, Any] | None = None) -> bool:
        with phase(CHECKPOINT_PHASE):  # the loop's blocking part: a hang allowance of its own
            return self._save_blocking(step, state, rng or capture_rng())

    def _save_blocking(self, step: int, state: Mapping[str, Any], rng: dict[str, Any]) -> bool:
        t0 = time.monotonic()
        pending = self._pending
        busy = pending is not None and not pending.done()
        if self._votes:  # DCP's save is a collective: the ranks skip alike (review 38 #5)
            busy, stopping = self._vote(busy, False)
            busy = busy and not stopping  # one saves this step on its way out: all do (#6)
        if busy and self.if_busy == "skip":
            behind = self._pending_step
            self._events.skipped(step, *(behind if behind else (None, None)))
            self._skipped = (step, state, rng)
            return False
        if pending is not None and not pending.done():
            _wait_quietly(pending)
        self._events.saving()
        self._raise_if_failing()
        try:
            job = self._job(step, state, rng, None, self.commit_timeout_s)
        except CheckpointError:
            raise  # the state itself cannot be saved: the script's bug, not the storage's
        except Exception as e:  # the sharded (DCP) write failed: counted like any failed save
            self._failed(step, e)
            self._raise_if_failing()
            return False
        resumed = time.monotonic()
        self.last_blocked_s = resumed - t0
        self._pending_step = (step, resumed)
        if self._owed is not None and step >= self._owed.step:  # a save covers it
            self._owed = None
        if self.async_save:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(1, thread_name_prefix="trainguard-ckpt")
            self._pending = self._executor.submit(self._run, job, (t0, resumed))
        else:
            fut: Future[SaveResult] = Future()
            try:
                fut.set_result(self._run(job, (t0, None)))  # the loop waits for the write
            except Exception as e:  # counted and reported in _run; raised below if too many
                fut.set_exception(e)
            self._pending = fut
            self._raise_if_failing()
        return True

    @property
    def _votes(self) -> bool:
        """Whether the ranks decide together on each save (sharded state, if_busy="skip")."""
        return self.if_busy == "skip" and self._sharded

    def _vote(self, held: bool, stopping: bool) -> tuple[bool, bool]:
        """(any rank holds this save back; any rank saves on its way out): one all-reduce,
        of one shape wherever it is called (at every save step of every rank, and at
        close(): a close() vote meeting a loop vote must not hang). `held`: in the loop,
        this rank's save in flight; in close(), this rank at its failure limit."""
        h, s = reduce_ints([int(held), int(stopping)], "max")
        return bool(h), bool(s)

    def vote_before_exit(self) -> None:
        """A rank saving on its way out at a save step votes too, saying so: the others save
        that step with it, not skip it (review 39 #6: it entered DCP's save while they
        waited in the vote, and neither moved)."""
        if self._votes:
            self._vote(False, True)

    def _job(self, step: int, state: Mapping[str, Any], rng: dict[str, Any],
             data: dict[str, Any] | None, commit_timeout_s: float,
             allow_missing: bool = False) -> SaveJob:
        replicated, per_rank, sharded = split(state)
        self._sharded = bool(sharded)  # alike on every rank: the state's structure
        extra: tuple[dict[str, Any], ...] = ()
        if sharded:  # collective and synchronous: DCP writes every rank's shards now
            staging = self.storage.staging_dir(step, save_token())
            extra = tuple(save_sharded(self.storage, staging, sharded, self.rank))
        if data is not None:  # data positions snapshotted at the step boundary
            per_rank.update(data)
        per_rank[RNG_KEY] = rng
        return SaveJob(
            storage=self.storage, step=step, rank=self.rank, world_size=self.world_size,
            token=save_token(), keep=self.keep, commit_timeout_s=commit_timeout_s,
            replicated=stage(replicated, self._pool, "r") if self.rank == 0 else None,
            per_rank=stage(per_rank, self._pool, "p"), library_version=__version__,
            allow_missing=allow_missing, dead=self._dead, interrupt=restart_if_asked,
            extra_files=extra,
            rewrite=step in self._bad_steps, bad_steps=frozenset(self._bad_steps),
            run_id=job_run_id())

    def save_snapshot(self, step: int, state: Mapping[str, Any], rng: dict[str, Any],
                      data: dict[str, Any], *, commit_timeout_s: float, reason: str) -> None:
        """Save synchronously on the way out (see exit_save.py); ranks that died are
        recorded as missing after commit_timeout_s."""
        self.wait_quietly()
        job = self._job(step, state, rng, data, commit_timeout_s, allow_missing=True)
        result = self._run(job, (0.0, None), on_exit=reason)
        log.info("checkpoint of step %s saved on the way out (%s)", result.step, reason)

    def abandon(self) -> None:
        """Give up the save in flight when its parts are not all written (an in-process
        restart: a rank that died never writes its part) and wait for it to end (at most
        one storage poll); nothing is saved on the way out either. run_resilient calls it;
        the Checkpointer is not used after."""
        self._abandoned, self._skipped = True, None
        self._owed = None  # the old group's step (review 49 #3)
        if self._exit is not None:  # its last step is the old group's: never saved at exit
            self._exit.close()
            self._exit = None
        self.wait_quietly()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        if self._memory is not None:
            self._memory.close()

    def _dead(self) -> set[int]:
        """Ranks the save need not wait for: those seen dead; every rank once abandoned."""
        return set(range(self.world_size)) if self._abandoned else dead_ranks()

    def wait_quietly(self) -> None:
        if self._pending is not None:
            _wait_quietly(self._pending)

    def _run(self, job: SaveJob, blocked: tuple[float, float | None],
             on_exit: str | None = None) -> SaveResult:
        """`blocked`: when the training loop began to wait for this save and when it went on
        (monotonic; None: it waits until this returns, a synchronous save): see
        SaveReporter.committed, called as soon as the commit is durable."""
        try:
            result = run_save(replace(job, on_commit=lambda r: self._events.committed(
                r, job.step, blocked, on_exit)))
        except Exception as e:
            self._failed(job.step, e, on_exit)
            raise
        with self._lock:
            self._failures, self._last_error = 0, None
        self.last_written_step = max(job.step, self.last_written_step or job.step)
        if result.committed or result.already_valid:  # other ranks: only their part is known
            self.last_saved_step = job.step
            self._bad_steps.discard(job.step)  # written anew: no longer the corrupt one
        self._events.other_jobs(result)  # another job writes here: a Warning
        return result

    def _failed(self, step: int, e: Exception, on_exit: str | None = None) -> None:
        with self._lock:
            self._failures += 1
            self._last_error, self._failed_step = e, step
            n = self._failures
            if on_exit is None and self._closing:  # close() waits for it: the last save
                on_exit = _LAST_SAVE
            # said: no save follows, or the rank stops (at the limit)
            self._told_final = on_exit is not None or n >= self.max_consecutive_failures
        self._events.failed(step, e, n, on_exit)

    def _raise_if_failing(self) -> None:
        with self._lock:
            n, err = self._failures, self._last_error
        if n >= self.max_consecutive_failures:
            raise CheckpointError(
                f"{n} checkpoint saves in a row failed; the last: {err}. Fix: check the "
                f"storage at {self.storage.location} (space, permissions, connectivity)")

    def wait(self) -> None:
        """Block until the save in flight is durable (or failed: counted as such)."""
        self._wait_in_phase()
        self._raise_if_failing()

    def _wait_in_phase(self) -> None:
        """Wait for the save in flight inside the checkpoint phase, the hang detector's
        allowance for a save (close() waited outside it: a long last save was confirmed hung
        and restarted, review 38 #2); its failure is not raised here."""
        if self._pending is not None and not self._pending.done():
            with phase(CHECKPOINT_PHASE):
                _wait_quietly(self._pending)

    def close(self) -> None:
        """Wait until the last save is durable (one skipped at the last step is written
        now); raise CheckpointError when it failed (no
        save follows: the rank must not end as if its state were kept; walk-through 27)."""
        try:
            final, self._skipped = self._skipped, None
            owed = self._owed.snapshot() if final is None and self._owed else None
            # the save in flight is the last only when no skipped step follows it (review 38
            # #2: its failure said "no save follows", then close() saved the skipped step)
            self._closing = final is None and owed is None
            self._wait_in_phase()  # its failure is said below, as the last save's (F9)
            stops = self._failures >= self.max_consecutive_failures  # its event said so
            if final is not None and self._votes:  # a collective: all ranks write or none
                stops = self._vote(stops, False)[0]
            if stops:
                final = None
            # a run of skipped saves ends: all told (F10), but the step written now (review
            # 38 #3: "the save of step 25 was skipped", then CheckpointSaved 25)
            self._events.saving(final=True, written=final[0] if final else None)
            if final is not None:
                self._closing = True
                self._save(*final)  # skipped at the last step: the loop is over (F10)
                self._wait_in_phase()
            elif owed is not None and not stops:
                self._closing = True
                with contextlib.suppress(Exception):  # counted by _run: said below
                    self.save_snapshot(owed.step, owed.state, owed.rng, owed.data,
                                       commit_timeout_s=self.commit_timeout_s, reason=_OWED)
            with self._lock:
                n, err, step, told = (self._failures, self._last_error, self._failed_step,
                                      self._told_final)
            if n:
                if not told and err is not None and step is not None:  # it said "retries"
                    self._events.failed(step, err, n, _LAST_SAVE)  # (walk-through 31 #5)
                kept = newest_kept(self.storage, self.last_saved_step if self.rank == 0
                                   else None)  # the others read it (walk-through 31 #4)
                raise CheckpointError(last_save_lost(step, err, n, kept, self.storage.location))
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None
            if self._memory is not None:
                self._memory.close()

    # -- loading --------------------------------------------------------------------------

    def load_latest(self, state: Mapping[str, Any]) -> int | None:
        """Load the newest valid checkpoint into `state`'s objects; its step, or None."""
        report_imports()  # the script's imports are done: standby workers learn them
        with phase(CHECKPOINT_PHASE):
            return self._load_latest(state)

    def _load_latest(self, state: Mapping[str, Any]) -> int | None:
        self.wait()
        step, stored = resume(self.storage, state, self.rank, self.world_size, self._memory,
                              partial(tell_skipped, self._bad_steps, self.storage.location))
        if stored:
            self.last_saved_step = step
        elif step is not None:  # from memory, newer than storage: no storage holds it
            self._owed = OwedStep(step, state)
        return step

    # -- listing --------------------------------------------------------------------------

    def list(self) -> list[CheckpointInfo]:
        return list_checkpoints(self.storage)


def _wait_quietly(fut: Future[SaveResult]) -> None:
    """Wait for a save; its failure is already counted and reported by _run."""
    try:
        fut.result()
    except Exception:  # reported in _run, surfaced by _raise_if_failing
        return
