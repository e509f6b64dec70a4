"""Progress and phase marks: how a training script tells its launcher that it is not hung.

    import trainguard

    for step in range(start + 1, steps + 1):
        ...                                      # one training step
        trainguard.progress(step)                # cheap: call it every step
        if step % eval_every == 0:
            with trainguard.phase("eval", timeout_s=900):
                evaluate()                       # slow on purpose: its own allowance

What the agent does with them (hang detection): every `progress` message restarts the
rank's no-progress clock, and a rank whose clock runs past the job's hang timeout is
treated as hung. A `phase` gives work that is slow on purpose, such as evaluation or a
checkpoint save, its own allowance: while a phase is open the rank is judged against the
phase's `timeout_s` (the agent's default for phases when None) instead of the step
timeout. trainguard's Checkpointer marks its blocking parts (saving, loading, waiting for a
save to be durable) as `phase("checkpoint")` by itself, whether or not the script calls
progress().

Messages (JSON datagrams through trainguard.worker.channel; each also carries `kind`,
`rank`, `pid` and `at`, the sender's wall-clock time):

- `progress`: `step` (int). Sent on the first call, then at most every
  PROGRESS_INTERVAL_S, and at once when the step goes backwards (the script restarted from
  an older checkpoint). A step held back by that interval is sent when the interval ends,
  by a background thread, if no later call sent a step first (and at interpreter exit if
  the interval has not ended yet): the last step reported always arrives, so the step the
  agent knows lags the script's by at most 0.2 s even when the script then sleeps or ends.
  At interpreter exit a script that used these opens the phase `interpreter exit`
  (EXITING_PHASE), never closed: the launcher reads its teardown as the attempt ending.
- `phase`: `name`, `state` ("begin" or "end"), `timeout_s` (float or None), `depth` (1 for
  the outermost phase open in the sending thread, 2 for one nested in it...) and `seq` (per
  process, the same on a phase's begin and end, to pair them). An end also carries `ok`:
  False when the phase was left by an exception. Ends are sent on exceptions too.

- `train_metrics`: `step`, and `loss` and `learning_rate` when given (null when NaN or
  infinite): the job's metrics (`trainguard status`, `trainguard metrics`), per rank.

Delivery: the agent's socket queues only a few datagrams (net.unix.max_dgram_qlen, 10 by
default) between its polls, and a full queue drops what is sent. A progress message that
could not be sent is tried again at a call 10 ms later; a phase mark is retried for up to
about 0.13 s (longer than an agent poll), unless the previous mark failed that way too (the
agent is gone: no more waiting until a send succeeds again).

Without a launcher (TRAINGUARD_AGENT_SOCKET unset when first used) both are no-ops: a
progress() call then costs a global lookup and a comparison. Standard library only.
"""

from __future__ import annotations

import atexit
import itertools
import math
import os
import threading
import time
from types import TracebackType

from trainguard.worker import channel
from trainguard.worker.contract import (
    EXITING_PHASE,
    MessageKind,
    PhaseState,
)
from trainguard.worker.fields import (
    MAX_METRIC,
    MAX_NAME,
    MAX_SECONDS,
)

__all__ = ["PROGRESS_INTERVAL_S", "log_metrics", "phase", "progress"]

PROGRESS_INTERVAL_S = 0.2
_PROGRESS_RETRY_S = 0.01  # after a progress message was dropped
_MARK_RETRY_SLEEPS_S = (0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064)

_launcher: bool | None = None  # channel.available(), looked up once on first use
_last_step = 0
_next_send_at = -math.inf  # monotonic time after which the next progress is sent
_unsent = False  # _last_step was held back by the interval: the flusher sends it
_flusher: threading.Thread | None = None  # started on the first held-back step
_wake = threading.Event()
_send_lock = threading.Lock()  # one send at a time: the loop's or the flusher's
_monotonic = time.monotonic
_seq = itertools.count(1)
_local = threading.local()
_marks_failing = False  # the last phase mark was dropped despite the retries


def _detect() -> bool:
    global _launcher
    _launcher = channel.available()
    return _launcher


def progress(step: int) -> None:
    """Report that the script reached `step` (e.g. the number of optimizer steps done)."""
    global _last_step
    if _launcher is not True and (_launcher is False or not _detect()):
        return
    now = _monotonic()
    if now < _next_send_at and step >= _last_step:
        _last_step = step  # set before _unsent is read (the flusher clears it, then reads)
        _hold()
        return
    backwards = step < _last_step
    _last_step = step
    _send(now, force=backwards)


def _send(now: float, force: bool = False) -> None:
    """Send the last step unless one was sent less than the interval ago (not `force`);
    held back, it is left to the flusher."""
    global _next_send_at, _unsent
    with _send_lock:
        if not force and now < _next_send_at:  # the other sender was first
            _hold()
            return
        _unsent = False  # cleared before the step is read: a newer step sets it again
        sent = channel.send(MessageKind.PROGRESS, step=int(_last_step))
        _next_send_at = now + (PROGRESS_INTERVAL_S if sent else _PROGRESS_RETRY_S)
        if not sent:  # tried again: at a call 10 ms later, or by the flusher
            _hold()


def _hold() -> None:
    """The last step is not sent yet: the flusher sends it when the interval ends."""
    global _unsent
    if not _unsent:
        _unsent = True
        _wake_flusher()


def _wake_flusher() -> None:
    global _flusher
    if _flusher is None:
        _flusher = threading.Thread(target=_flush_loop, name="trainguard-progress",
                                    daemon=True)
        _flusher.start()
    _wake.set()


def _flush_loop() -> None:
    """Send a held-back step when the interval ends, unless a later call did first."""
    while True:
        _wake.wait()
        _wake.clear()
        while _unsent and _launcher:
            wait = _next_send_at - _monotonic()
            if wait > 0:
                time.sleep(min(max(wait, _PROGRESS_RETRY_S), PROGRESS_INTERVAL_S))
                continue
            _send(_monotonic())
            if _unsent:  # not sent (the agent's queue is full, or it is gone): not so often
                time.sleep(PROGRESS_INTERVAL_S)


@atexit.register
def _flush_at_exit() -> None:
    """The script ended (returned or raised) and the interpreter exits: send a step the
    interval held back, then open EXITING_PHASE, never closed: the teardown that follows
    (seconds, with torch on a loaded machine) is the attempt ending, not a hang."""
    if not _launcher:
        return
    if _unsent:
        _send(_monotonic(), force=True)
    _send_mark(name=EXITING_PHASE, state=PhaseState.BEGIN, timeout_s=None,
               depth=getattr(_local, "depth", 0) + 1, seq=next(_seq))


def _after_fork_in_child() -> None:
    global _flusher, _wake, _send_lock
    _flusher, _wake, _send_lock = None, threading.Event(), threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def log_metrics(step: int, loss: float | None = None,
                learning_rate: float | None = None) -> bool:
    """Report the training loss and learning rate at `step` (as a logger would: every few
    steps) for the job's metrics; what is not given keeps its last value. One datagram per
    call, never throttled: the last call's values are the ones shown. True when sent."""
    if _launcher is not True and (_launcher is False or not _detect()):
        return False
    fields = {k: _metric(v) for k, v in (("loss", loss), ("learning_rate", learning_rate))
              if v is not None}
    return channel.send(MessageKind.TRAIN_METRICS, step=int(step), **fields)


def _metric(value: float) -> float | None:
    """A value as the contract carries it: a float, None for NaN or an infinity (or a value
    past MAX_METRIC), which the metrics show as NaN."""
    v = float(value)  # a 0-d tensor too
    return v if math.isfinite(v) and abs(v) <= MAX_METRIC else None


class phase:  # lower case: used like a function, `with trainguard.phase("eval"):`
    """A stretch of work that is slow on purpose, with its own hang allowance.

    `timeout_s`: how long the phase may take before the agent calls the rank hung (never
    less than the job's hang threshold); None leaves it to the agent's default for phases;
    one over MAX_SECONDS (about 31 years) counts as MAX_SECONDS. Phases nest; one object may
    be re-entered once it has been left.
    """

    __slots__ = ("_seq", "name", "timeout_s")

    def __init__(self, name: str, timeout_s: float | None = None) -> None:
        if not name:
            raise ValueError("a phase needs a name, e.g. phase('eval')")
        if timeout_s is not None and not 0 < timeout_s < math.inf:
            raise ValueError(f"phase timeout_s must be > 0 seconds or None, got {timeout_s!r}")
        self.name = name
        self.timeout_s = None if timeout_s is None else min(float(timeout_s), MAX_SECONDS)
        self._seq = 0

    def __enter__(self) -> None:
        depth = getattr(_local, "depth", 0) + 1
        _local.depth = depth
        if _launcher is True or (_launcher is None and _detect()):
            self._seq = next(_seq)
            _send_mark(name=self.name[:MAX_NAME], state=PhaseState.BEGIN,
                       timeout_s=self.timeout_s, depth=depth, seq=self._seq)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        depth = getattr(_local, "depth", 1)
        _local.depth = depth - 1
        if _launcher is True:
            _send_mark(name=self.name[:MAX_NAME], state=PhaseState.END,
                       timeout_s=self.timeout_s, depth=depth, seq=self._seq, ok=exc_type is None)


def _send_mark(**fields: object) -> None:
    """Send a phase mark; a full agent queue empties at its next poll, so retry a while."""
    global _marks_failing
    if channel.send(MessageKind.PHASE, **fields):
        _marks_failing = False
        return
    if _marks_failing:
        return
    for pause in _MARK_RETRY_SLEEPS_S:
        time.sleep(pause)
        if channel.send(MessageKind.PHASE, **fields):
            return
    _marks_failing = True
