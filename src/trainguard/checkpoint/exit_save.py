"""Save on the way out: a final checkpoint of the last completed step when a rank stops.

Opt-in (`Checkpointer(save_on_exit=True)`, or `trainguard run --save-on-exit`, which sets
TRAINGUARD_SAVE_ON_EXIT). Two ways out:
- SIGTERM (the launcher stops the ranks: a peer failed, or the job was stopped): the signal
  is only recorded; at the next `maybe_save` the step is complete, so it is saved
  synchronously and the rank exits with 128+signal.
- an error (a collective failed because a peer died): at interpreter exit, the state of the
  last completed step is saved, but only if no optimizer step ran since that step (an
  optimizer step hook proves it), with the RNG and data positions snapshotted then.
Ranks that died cannot write their part: the commit waits part of the grace period and
records them as missing; on resume they take the data position of a surviving rank and a
fresh RNG.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Mapping
from types import FrameType
from typing import TYPE_CHECKING, Any

from trainguard.checkpoint.boundary import StepBoundary
from trainguard.checkpoint.snapshot_timing import flush_reports
from trainguard.worker import channel, control
from trainguard.worker.contract import (
    ENV_DEAD_RANKS,
    ENV_GRACE,
    ENV_SAVE_ON_EXIT,
    EXIT_SAVE_PHASE,
    MessageKind,
)
from trainguard.worker.progress import phase

if TYPE_CHECKING:
    from trainguard.checkpoint.checkpointer import Checkpointer

log = logging.getLogger(__name__)


def dead_ranks() -> set[int]:
    """Ranks the launcher saw die in this attempt (so the exit commit need not wait)."""
    path = os.environ.get(ENV_DEAD_RANKS)
    if not path:
        return set()
    try:
        with open(path, encoding="utf-8") as f:
            return {int(r) for r in json.load(f)}
    except (OSError, ValueError, TypeError):
        return set()


def enabled_by_env() -> bool:
    return os.environ.get(ENV_SAVE_ON_EXIT, "") in ("1", "true", "yes")


def _exit_now(code: int) -> None:
    """End the rank at once, as the stop signal's default action would, now that its last
    step is durable: no interpreter shutdown, which waits for every non-daemon thread and
    tears torch down (seconds under load; forever with a thread that never ends), so the
    stop takes what the save takes, not the grace period."""
    flush_reports()  # the memory snapshots' blocking not reported yet: no atexit here
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


class ExitSaver:
    def __init__(self, ckpt: Checkpointer) -> None:
        self._ckpt = ckpt
        self.stop_signal: int | None = None
        self._boundary = StepBoundary()
        self._done = False
        grace = float(os.environ.get(ENV_GRACE, "30") or 30)
        self.commit_timeout_s = max(1.0, grace / 2)  # leave the rest of the grace to write
        self._old_term: Any = None
        if threading.current_thread() is threading.main_thread():
            self._old_term = signal.signal(signal.SIGTERM, self._on_signal)
        atexit.register(self._at_exit)

    def close(self) -> None:
        """Nothing is saved on the way out any more (an in-process restart abandoned this
        Checkpointer: its last step is the old group's, and the re-entered function's own
        Checkpointer saves from now on; walk-through 27: the survivor's old step was
        committed at exit, after the job's last, and `latest` pointed back at it). A stop
        signal before the new Checkpointer exists gets the handler that was there before."""
        self._done = True
        atexit.unregister(self._at_exit)
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGTERM) == self._on_signal:
            signal.signal(signal.SIGTERM, self._old_term if self._old_term is not None
                          else signal.SIG_DFL)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._boundary.last is None:  # no step done yet (start-up, loading): nothing to save
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        if self.stop_signal is None:  # once: a second signal inside set() must not re-enter
            control.STOPPING.set()  # a rank waiting for a step's verdict goes on to exit
        self.stop_signal = signum  # acted on at the next step boundary, or at exit

    def step_done(self, step: int, state: Mapping[str, Any], saves: bool = False) -> None:
        """Called at each step boundary (`saves`: one where the Checkpointer saves): remember
        it; on a stop signal, save and exit."""
        self._boundary.mark(step, state)
        if self.stop_signal is not None:
            if saves:  # where the other ranks vote on the save, this one votes too
                self._ckpt.vote_before_exit()
            self._save("the launcher stopped this rank")
            _exit_now(128 + self.stop_signal)

    def _saved(self, step: int) -> bool:
        """Whether this rank's part of `step` is durable already: committed, or (on ranks
        other than 0, whose saves end when their part is written) written by a periodic save
        that rank 0 commits. Saving it again would race that commit: rank 0 renames the
        staging directory this rank would be writing into."""
        ckpt = self._ckpt
        ckpt.wait_quietly()  # a periodic save in flight: its end decides
        return any(s is not None and step <= s
                   for s in (ckpt.last_saved_step, ckpt.last_written_step))

    def _at_exit(self) -> None:
        snap = self._boundary.last
        if self._done or snap is None or self._saved(snap.step):
            return
        why = self._boundary.why_not()
        if why is not None:
            self._skip(snap.step, why)
        else:
            self._save("the rank is exiting with its last step unsaved")

    def _skip(self, step: int, why: str) -> None:
        self._done = True
        log.warning("no checkpoint on the way out: %s", why)
        channel.send(MessageKind.CHECKPOINT_EXIT_SKIPPED, step=step, reason=why)

    def _save(self, reason: str) -> None:
        self._done = True
        snap = self._boundary.last
        if snap is None:
            return
        if self._saved(snap.step):
            log.info("checkpoint of step %s is already saved: not saved again on the way out",
                     snap.step)
            return
        try:
            # in a phase the launcher reads as the attempt ending: while this rank saves,
            # its peers wait for it in a collective, and no hang is to be confirmed
            with phase(EXIT_SAVE_PHASE, timeout_s=self.commit_timeout_s + 60):
                self._ckpt.save_snapshot(snap.step, snap.state, snap.rng, snap.data,
                                         commit_timeout_s=self.commit_timeout_s,
                                         reason=reason)
        except Exception as e:  # the way out must go on: report, do not mask the exit
            log.warning("checkpoint on the way out failed: %s", e)
