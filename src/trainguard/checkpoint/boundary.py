"""The state at a script's last step boundary, and the proof that it still holds.

A save made outside the loop's own cadence (on the way out, or by close() for a step resumed
from memory that no storage holds) must write the last *completed* step: the objects in the
state are live, so one more optimizer step, or the next batch drawn, changes them under the
step's number. At each boundary the RNG and the data positions are copied, and an optimizer
step hook counts the steps since: the snapshot holds while none ran (review 49 #2: close()
wrote step 4's weights as step 3 after a step that raised past its optimizer step).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from trainguard.checkpoint.sampler import data_state, is_data_position
from trainguard.checkpoint.state import capture_rng

log = logging.getLogger("trainguard.checkpoint.checkpointer")  # the Checkpointer's lines


@dataclass(frozen=True)
class Snapshot:
    step: int
    state: Mapping[str, Any]
    rng: dict[str, Any]
    data: dict[str, Any]  # the data positions at the boundary (a batch drawn since moves them)
    optimizer_steps: int


class StepBoundary:
    def __init__(self) -> None:
        self.last: Snapshot | None = None
        self._optimizer_steps = 0
        self._hooked: set[int] = set()

    def mark(self, step: int, state: Mapping[str, Any]) -> None:
        """`step` is complete and `state` holds it (a step boundary)."""
        for obj in state.values():
            if isinstance(obj, torch.optim.Optimizer) and id(obj) not in self._hooked:
                obj.register_step_post_hook(self._count_step)
                self._hooked.add(id(obj))
        self.last = Snapshot(step, state, capture_rng(),
                             {k: data_state(v) for k, v in state.items()
                              if is_data_position(v)}, self._optimizer_steps)

    def _count_step(self, *args: Any) -> None:
        self._optimizer_steps += 1

    def why_not(self) -> str | None:
        """Why the last snapshot may not be saved as its step, or None when it may."""
        if self.last is None:
            return "no step was done"
        if not self._hooked:
            return "no optimizer in the state proves the step was complete"
        if self.last.optimizer_steps != self._optimizer_steps:
            return f"an optimizer step ran after step {self.last.step}"
        return None


class OwedStep:
    """A step the Checkpointer resumed from memory that no storage holds: close() writes the
    last step boundary since, unless a save at or past the step started (walk-through 40
    #1: resumed at the run's last step after the storage filled up, the loop ran no step,
    and the job succeeded with its state only in the node's memory, freed at its end), and
    only while no optimizer step ran past that boundary (review 49 #2)."""

    def __init__(self, step: int, state: Mapping[str, Any]) -> None:
        self.step = step
        self.boundary = StepBoundary()
        self.boundary.mark(step, state)

    def snapshot(self) -> Snapshot | None:
        """The boundary to write, or None (said when it no longer holds its step)."""
        why = self.boundary.why_not()
        if why is not None:
            log.warning("step %s (resumed from memory) is in no storage, and is not written "
                        "at close: %s", self.step, why)
            return None
        return self.boundary.last
