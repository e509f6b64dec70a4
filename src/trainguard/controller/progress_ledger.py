"""The step ledger the recorder keeps in the job store (its `progress` table): the first step
of each attempt (or in-process restart) and every new last step, with the time the workers
reached it; goodput's steps done once and done again are counted from it.

Samples are written at most every WRITE_EVERY_S. One the store cannot take (a full disk)
waits, up to MAX_WAITING (then every other waiting sample goes: a ledger thinned, not cut
off), and is written once there is room, at the latest from the room kept for the job's end
(walk-through 37 #7: after the job-dir disk filled up the ledger was never written again,
and `report` counted 140 of 250 steps done once, 0 done again).
"""

from __future__ import annotations

import time

from trainguard.controller.store import JobStore
from trainguard.protocol import Progress

WRITE_EVERY_S = 1.0
MAX_WAITING = 100_000  # samples kept while the store cannot be written (one per new step)

Sample = tuple[int, int, float]  # attempt, step, epoch seconds


class ProgressLedger:
    def __init__(self, store: JobStore) -> None:
        self.store = store
        self._waiting: list[Sample] = []  # not written yet
        self._sampled: Sample | None = None  # the last sample
        self._written_at = 0.0

    def take_over(self, attempt: int) -> None:
        """A controller that took over: the dead one's last sample of the attempt."""
        self._sampled = self.store.last_sample(attempt)

    def due(self, force: bool = False) -> bool:
        return force or time.monotonic() - self._written_at >= WRITE_EVERY_S

    def write(self) -> None:
        """Write the waiting samples (a StoreError leaves them waiting)."""
        self.store.add_progress(self._waiting)
        self._waiting = []
        self._written_at = time.monotonic()

    def sample(self, attempt: int, p: Progress) -> None:
        """The first step of each attempt (or in-process restart) and every new last step.
        Within an attempt a first step is a new start (an in-process restart) only when it
        came after the last step sampled: an earlier one is the same start as another node
        saw it (the merged report takes the earliest node's once that node has reported),
        or as the dead controller sampled it (a takeover); sampled again, the ledger read it
        as steps done again (walk-through 26)."""
        if p.first_step is None or p.first_step_at is None:
            return
        seen = self._sampled
        first_at = p.first_step_at.timestamp()
        if seen is None or seen[0] != attempt or first_at > seen[2]:
            self._add((attempt, p.first_step, first_at))
            seen = self._sampled = (attempt, p.first_step, first_at)
        if p.last_step is not None and p.last_step_at is not None and p.last_step != seen[1]:
            self._sampled = (attempt, p.last_step, p.last_step_at.timestamp())
            self._add(self._sampled)

    def _add(self, s: Sample) -> None:
        self._waiting.append(s)
        if len(self._waiting) > MAX_WAITING:
            self._waiting = thinned(self._waiting)


def thinned(samples: list[Sample]) -> list[Sample]:
    """Every other sample, but each start (a new attempt's first step, or a step lower than
    the one before: an in-process restart) and the sample before it, and the last: where a
    stretch began and ended is what counts steps done again (review 43 #10)."""
    keep = {0, len(samples) - 1}
    for i in range(1, len(samples)):
        (a, step, _), (pa, pstep, _) = samples[i], samples[i - 1]
        if a != pa or step < pstep:
            keep.update((i - 1, i))
    return [x for i, x in enumerate(samples) if i % 2 == 0 or i in keep]
