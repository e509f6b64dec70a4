"""Signals for the controller: handlers only record; the attempt loop acts on them."""

from __future__ import annotations

import signal
import time
from types import FrameType


class SignalReceiver:
    """Records SIGINT/SIGTERM/SIGHUP for the main loop; restores the old handlers on exit."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.received: int | None = None
        self._old: dict[int, object] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signum

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
