"""The trainer integrations' marks of work that reports no step (an evaluation, a
validation, a test, a prediction) as a phase renewed at each of its batches.

A phase of its own keeps a long evaluation after a few fast steps from reading as a hang
(review 47 #1); renewed at each batch with a bounded allowance, a batch that never returns is
still confirmed within that allowance, not after the 30 minutes of an unbounded phase
(review 48 #1: a DDP evaluation whose ranks disagree on a collective, a stuck loader). The
allowance, TRAINGUARD_EVAL_BATCH_S seconds (default EVAL_BATCH_S), is never below the hang
threshold (the detector takes the larger).
"""

from __future__ import annotations

import os
import time

from trainguard.worker.contract import ENV_EVAL_BATCH_S
from trainguard.worker.progress import phase

EVAL_BATCH_S = 300.0  # an evaluation batch may take this long (generation, a slow metric)
RENEW_S = 1.0  # at most one renewal a second: two datagrams each


def batch_allowance() -> float:
    """TRAINGUARD_EVAL_BATCH_S when it is a number of seconds > 0, else EVAL_BATCH_S."""
    try:
        value = float(os.environ.get(ENV_EVAL_BATCH_S, ""))
    except ValueError:
        return EVAL_BATCH_S
    return value if 0 < value < float("inf") else EVAL_BATCH_S


class RenewedPhase:
    """One phase at a time, named when it begins: begin(), batch() after each batch, end()."""

    def __init__(self) -> None:
        self._open: phase | None = None
        self._name = ""
        self._renewed_at = 0.0

    def begin(self, name: str) -> None:
        self.end()
        self._name = name
        self._open = phase(name, timeout_s=batch_allowance())
        self._open.__enter__()
        self._renewed_at = time.monotonic()

    def batch(self) -> None:
        """A batch is done: the next one gets the whole allowance (throttled to RENEW_S)."""
        if self._open is not None and time.monotonic() - self._renewed_at >= RENEW_S:
            self.begin(self._name)

    def end(self, error: BaseException | None = None) -> None:
        if self._open is not None:
            self._open.__exit__(type(error) if error else None, error, None)
            self._open = None

    @property
    def name(self) -> str | None:
        """The phase open now, or None."""
        return self._name if self._open is not None else None
