"""A SIGTERM to the node agent: the cluster ending its step (Slurm's requeue, preemption, time
limit or scancel signal every process of the step, the workers too, and SIGKILL them KillWait
later).

The agent used to die of it at once, and its guardian SIGKILLed the workers with it: a
requeued job's ranks got no grace period, `--save-on-exit` saved nothing, and they read
`failed` with no exit code (walk-through 42 #12). Now the agent stays for its workers: they
have the signal already (and save at their next step end when saving on exit); the
controller, whose launcher got the same signal, stops them with its grace period and ends
the agent. Only when no controller is there, or it has not ended the agent within the grace
period (and TERM_SLACK_S), does the agent stop its workers itself and end. Only a flag is set
in the handler.
"""

from __future__ import annotations

import signal
import time
from types import FrameType

TERM_SLACK_S = 5.0  # past the grace period, a connected controller's stop is given up on
EXIT_TERMINATED = 128 + signal.SIGTERM  # the agent's exit after it stopped its workers itself


class Termination:
    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.at: float | None = None  # when the first SIGTERM came (monotonic)
        self.ended = False  # the agent stopped its workers itself and ends
        self._seen = False

    def install(self) -> None:
        """Handle SIGTERM (the agent's main thread only)."""
        signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.at is None:
            self.at = time.monotonic()

    def fresh(self) -> bool:
        """True once, after the first SIGTERM: time to say so and count 143s as stops."""
        if self.at is None or self._seen:
            return False
        self._seen = True
        return True

    def due(self, connected: bool) -> bool:
        """Whether the agent ends its workers itself now: no controller to do it, or none did
        within the grace period."""
        return self.at is not None and (
            not connected or time.monotonic() - self.at > self.grace_s + TERM_SLACK_S)

    def grace_left(self) -> float:
        """What is left of the workers' grace period since the SIGTERM."""
        return 0.0 if self.at is None else max(0.0, self.grace_s - (time.monotonic() - self.at))
