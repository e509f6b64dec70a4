"""What the Checkpointer tells the launcher (and the rank's log) about its saves: a commit,
a failed save, and a save that wrote nothing (skipped behind the save in flight, or its step
committed by another job); and the newest committed step close() names."""

from __future__ import annotations

import logging
import time

from trainguard.checkpoint.loading import newest_valid_step
from trainguard.checkpoint.saving import SaveResult
from trainguard.checkpoint.storage import Storage
from trainguard.worker import channel
from trainguard.worker.contract import MessageKind, after_failed_save

log = logging.getLogger(__name__)

REPEAT_S = 60.0  # a save skipped at every step is told once, then at most once a minute


class SaveReporter:
    def __init__(self, location: str, rank: int, limit: int) -> None:
        self.location, self.rank, self.limit = location, rank, limit
        self._run: list[int] = []  # the steps of the saves skipped in a row (if_busy="skip")
        self._run_told = 0  # how many of them the last Warning counted
        self._run_behind: int | None = None  # the save in flight they were skipped behind
        # runs of skips whose summary the minute's limit held back: told later, never dropped
        self._untold: list[tuple[list[int], int | None]] = []
        self._told_at: dict[str, float] = {}  # what: when last told (rate limit)

    def committed(self, result: SaveResult, step: int, blocked: tuple[float, float | None],
                  on_exit: str | None) -> None:
        """Rank 0, as soon as the commit is durable (before `latest` and pruning).
        `blocked`: when the loop began to wait for this save and when it went on (None: it
        waits until the save returns); the event says how long it waited and how long before
        the commit it went on."""
        now = time.monotonic()  # (a save on the way out: after the loop, blocking none)
        since, until = (now, now) if on_exit else (blocked[0], blocked[1] or now)
        channel.send(MessageKind.CHECKPOINT_SAVED, step=step, location=self.location,
                     bytes=result.total_bytes, write_s=round(result.write_s, 4),
                     blocked_s=round(until - since, 4), resumed_before_s=round(now - until, 4),
                     on_exit=on_exit, missing_ranks=list(result.missing_ranks))

    def failed(self, step: int, e: BaseException, n: int, on_exit: str | None) -> None:
        """The rank's log line says what follows, as the event does (walk-through 35 F8: the
        diagnosis names the first such line it has not seen the rank get past, and "step 30
        failed (2 in a row)" read as if the rank gave up after two failed saves)."""
        then = on_exit or after_failed_save(n, self.limit)
        log.warning("checkpoint save of step %s failed (%s in a row; %s): %s", step, n, then, e)
        channel.send(MessageKind.CHECKPOINT_SAVE_FAILED, step=step, error=str(e)[:500],
                     consecutive=n, limit=self.limit, location=self.location, on_exit=on_exit)

    def saving(self, final: bool = False, written: int | None = None) -> None:
        """A save started, or close() waited for the last one (`final`): the run of skipped
        saves (if any) ended. When some of its skips went untold (within the minute), one
        Warning says how many and which steps (review of walk-through 31 #14: a run shorter
        than a minute said only its first skip); one held back by the minute's limit is told
        with the next, and close() tells whatever is left (walk-through 35 F10: a run of skips
        ending within a minute of the last summary, the final step's included, was dropped). The
        step close() is about to write (`written`) is not told as skipped (review 38 #3)."""
        run, told, busy = self._run, self._run_told, self._run_behind
        self._run, self._run_told, self._run_behind = [], 0, None
        if written is not None and run and run[-1] == written:  # close() writes it now
            run = run[:-1]
            told = min(told, len(run))
        if len(run) > told:
            self._untold.append((run, busy))
        if self._untold and self._tell("skip-run", self._untold[-1][0][-1],
                                       _skips_text(self._untold, self._slow_fix()),
                                       force=final):
            self._untold = []

    def skipped(self, step: int, in_flight: int | None, since: float | None) -> None:
        """A save skipped because the previous one is still being written (if_busy="skip";
        walk-through 31 #12): a Warning at once, saying what a crash now loses, then at most
        once a minute; saving() sums up the run."""
        self._run.append(step)
        self._run_behind = in_flight
        held = f" for {time.monotonic() - since:.1f}s" if since is not None else ""
        run = (f"; {len(self._run)} saves in a row skipped, since step {self._run[0]}"
               if len(self._run) > 1 else "")
        if self._tell("skip", step, f"the save of step {in_flight} is still being written{held} "
                      f"(if_busy='skip'){run}: until it commits, a crash resumes from a step "
                      f"before {in_flight} and loses every step since. Fix: if this repeats, "
                      f"{self._slow_fix()}"):
            self._run_told = len(self._run)

    def _slow_fix(self) -> str:
        return (f"the storage at {self.location} is slower than the saves: save less often, "
                "or use if_busy='wait'")

    def other_jobs(self, result: SaveResult) -> None:
        """What a save found of another job in the dir: its step committed by that job
        (walk-through 31 #3), or steps of another job that writes the dir too, left alone by
        the prune (review #3, checkpoint/sharing.py): newer than the one committed (this job
        is behind) or older (ahead)."""
        if result.other_writer is not None:
            self.other_writer(result.step, result.other_writer)
        elif result.of_other_job is not None:
            theirs, job = result.of_other_job  # committed: the rank's log says it (the
            # event kind says a save that wrote nothing)
            if theirs > result.step:
                risk = (f"newer than this one, committed by the job {job!r}: two jobs write "
                        "this dir, and a restart of this job would resume the other job's "
                        f"weights (step {theirs})")
            else:
                risk = (f"committed by the job {job!r}, which writes this dir too (it launched "
                        "into it after this job, or saved there since)")
            self._tell("other_job", result.step, f"the checkpoint dir {self.location} holds "
                       f"step {theirs}, {risk}; its steps are neither counted nor pruned "
                       "here. Fix: give each job its own --checkpoint-dir", event=False)
        elif result.already_valid:
            log.info("checkpoint of step %s is already committed: not written again",
                     result.step)

    def other_writer(self, step: int, job: str) -> None:
        """The step is committed already, by another job (walk-through 31 #3): this job's
        state of it is not kept, and a resume would load the other job's."""
        self._tell("other", step, f"the checkpoint dir {self.location} already holds step "
                   f"{step}, committed by the job {job!r}: this job's state of step {step} is "
                   f"not written, and a restart of this job would resume the other job's "
                   "weights. Fix: give each job its own --checkpoint-dir (two jobs write "
                   "this one)")

    def _tell(self, what: str, step: int, reason: str, event: bool = True,
              force: bool = False) -> bool:
        """A Warning (`event`: a CheckpointSaveSkipped too, a save that wrote nothing; else
        the rank's log only, of a save committed), unless one of this kind was told within
        REPEAT_S (False then) and not `force`."""
        now = time.monotonic()
        last = self._told_at.get(what)
        if last is not None and now - last < REPEAT_S and not force:
            return False
        self._told_at[what] = now
        log.warning("checkpoint of step %s %s: %s", step,
                    "skipped" if event else "committed, but", reason)
        if self.rank == 0 and event:
            channel.send(MessageKind.CHECKPOINT_SAVE_SKIPPED, step=step, reason=reason[:900],
                         location=self.location)
        return True


def _skips_text(runs: list[tuple[list[int], int | None]], fix: str) -> str:
    """The summary of runs of skipped saves: one run as before, several (held back by the
    minute's limit) with their steps and the saves they were skipped behind."""
    if len(runs) == 1:
        run, busy = runs[0]
        saves = (f"{len(run)} saves in a row were skipped, steps {run[0]} to {run[-1]}"
                 if len(run) > 1 else f"the save of step {run[0]} was skipped")
        return (f"{saves}, while the save of step {busy} was being written (if_busy='skip'): "
                f"a crash then resumed from a step before {busy}. Fix: {fix}")
    spans = [f"{r[0]} to {r[-1]}" if len(r) > 1 else str(r[0]) for r, _ in runs]
    behind = [str(b) for _, b in runs]
    if len(runs) > 6:  # the event's reason is cut at 900 characters
        spans, behind = [*spans[:2], "...", *spans[-3:]], [*behind[:2], "...", *behind[-3:]]
    return (f"{sum(len(r) for r, _ in runs)} saves were skipped, steps {', '.join(spans)}, "
            f"each while the save before it was being written (of steps {', '.join(behind)}; "
            "if_busy='skip'): a crash then resumed from a step before that save. "
            f"Fix: {fix}")


def newest_kept(st: Storage, last_saved: int | None) -> str:
    """The newest committed step, for close()'s error: rank 0 knows it (`last_saved`), the
    other ranks pass None and it is read from storage (walk-through 31 #4: they said "none"
    while steps were committed, then the step they resumed from)."""
    if last_saved is not None:
        return str(last_saved)
    try:
        newest = newest_valid_step(st)
    except Exception as e:  # the storage the save failed on: say so, claim nothing
        return f"unknown: the storage could not be read ({type(e).__name__})"
    return "none" if newest is None else str(newest)


def last_save_lost(step: int | None, err: BaseException | None, n: int, kept: str,
                   location: str) -> str:
    """close()'s error when the last save failed, whatever the count (walk-through 35 F9:
    at the limit, "3 saves in a row failed" named neither the step lost nor the newest
    committed checkpoint, nor that a rerun starts over when there is none)."""
    count = f" ({n} in a row)" if n > 1 else ""
    if kept == "none":
        lost, then = ("no checkpoint was committed", "then run the job again: it starts over "
                      "(nothing to resume from)")
    else:
        lost, then = (f"the steps after the newest committed checkpoint ({kept}) are not kept",
                      "then run the job again: it resumes there")
    return (f"the last checkpoint save (step {step}) failed{count} and no save follows: "
            f"{err}; {lost}. Fix: free or fix the storage at {location} (space, permissions, "
            f"connectivity), {then}")
