"""A SIGTERM to the node agent: the cluster ending its step (Slurm's requeue, preemption, time
limit or scancel signal every process of the step, the workers too, and SIGKILL them KillWait
later), or a person's.

The agent used to die of it at once, and its guardian SIGKILLed the workers with it: a
requeued job's ranks got no grace period, `--save-on-exit` saved nothing, and they read
`failed` with no exit code (walk-through 42 #12). Now the agent stops its workers itself, as
the controller's stop does (SIGTERM, which they may have from the cluster already, the
grace period, SIGKILL), reporting meanwhile, and a worker's 143 reads `stopped`; then it
serves on while a controller is connected (it ends the job, or the agent, as it sees fit:
review 52 #1, #2), else it ends. Only a flag is set in the handler.
"""

from __future__ import annotations

import signal
from types import FrameType

EXIT_TERMINATED = 128 + signal.SIGTERM  # the agent's exit when it ended on its SIGTERM


class Termination:
    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s  # the job's grace period, which the workers get
        self.at_signal = False  # a SIGTERM came
        self._seen = False
        self.ended = False  # the agent ends on it (no controller)

    def install(self) -> None:
        """Handle SIGTERM (the agent's main thread only)."""
        signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.at_signal = True

    def fresh(self) -> bool:
        """True once, after the first SIGTERM: time to stop the workers."""
        if not self.at_signal or self._seen:
            return False
        self._seen = True
        return True
