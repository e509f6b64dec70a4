"""Signals for the controller: handlers only record; the attempt loop acts on them."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from types import FrameType


class SignalReceiver:
    """Records SIGINT/SIGTERM/SIGHUP for the main loop; restores the old handlers on exit."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    # a signal this soon after the first is the same stop delivered twice (a batch system
    # that signals both the job's step and its shell), not a second request
    REPEAT_AFTER_S = 1.0

    def __init__(self) -> None:
        self.received: int | None = None
        self.repeated = False  # a second signal came: the stop should not wait any longer
        # ends the stop's grace period where it runs (the single-node agent's, or every node
        # agent's through a Hurrier); sets flags only, since the signal handler calls it.
        # None: a second signal changes nothing
        self.on_repeat: Callable[[], None] | None = None
        self._first_at = 0.0
        self._old: dict[int, object] = {}

    def stopping(self) -> bool:
        """A stop was asked for (a signal came)."""
        return self.received is not None

    @property
    def cut_short(self) -> bool:
        """A second signal ended the grace period (only where it can: `on_repeat` set)."""
        return self.repeated and self.on_repeat is not None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received, self._first_at = signum, time.monotonic()
        elif signum != signal.SIGHUP and not self.repeated and \
                time.monotonic() - self._first_at >= self.REPEAT_AFTER_S:
            self.repeated = True  # a second Ctrl-C or SIGTERM; a hangup repeats alone
            if self.on_repeat is not None:  # once: a third signal inside it must not re-enter
                self.on_repeat()

    def sleep(self, seconds: float) -> bool:
        """Wait (a restart's backoff); False when a signal came first."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.received is not None:
                return False
            time.sleep(min(0.05, max(deadline - time.monotonic(), 0)))
        return True

    def __enter__(self) -> SignalReceiver:
        for s in self.SIGNALS:
            self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)  # type: ignore[arg-type]


class Hurrier:
    """A second signal passed on to every node agent of a multi-node job (`send`: the hub's
    frames). The signal handler only sets an event; a thread of its own sends, since a send
    holds its connection's lock, which the interrupted main thread may hold."""

    def __init__(self, send: Callable[[], None]) -> None:
        self._asked = threading.Event()
        self._send = send
        threading.Thread(target=self._run, name="trainguard-hurry", daemon=True).start()

    def __call__(self) -> None:
        self._asked.set()

    def _run(self) -> None:
        self._asked.wait()
        self._send()
