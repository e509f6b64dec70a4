"""How long memory snapshots hold the training loop, told to the node agent in batches.

Rank 0 times each snapshot (what `MemoryTier.maybe_snapshot` holds the loop for: the copy
and the manifest's commit) and sends the sum and the count since its last report
(MessageKind.SNAPSHOT_BLOCKING): at most every REPORT_EVERY_S, when the Checkpointer closes
(an in-process restart too) and when the interpreter exits. The job's goodput books it as
`checkpoint_blocking` (docs/goodput.md). `BlockingTally` is pure; `SnapshotTimer` sends.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from trainguard.worker import channel
from trainguard.worker.contract import MessageKind

REPORT_EVERY_S = 5.0  # a batch at most this often: no message per step


@dataclass
class BlockingTally:
    """The snapshots since the last report. Pure: the caller gives every time."""

    every_s: float = REPORT_EVERY_S
    seconds: float = 0.0  # their blocking, summed
    count: int = 0
    step: int | None = None  # the last one's step
    ended_at: float | None = None  # when the last one returned (Unix time)
    since: float | None = None  # monotonic: the last report, or the first snapshot after it

    def add(self, step: int, blocked_s: float, ended_at: float,
            now: float) -> dict[str, Any] | None:
        """Count one snapshot that held the loop `blocked_s` and returned at `ended_at`
        (`now`: monotonic); the batch to send when one is due."""
        self.seconds += max(0.0, blocked_s)
        self.count += 1
        self.step, self.ended_at = step, ended_at
        if self.since is None:
            self.since = now
        if now - self.since < self.every_s:
            return None
        self.since = now
        return self.take()

    def take(self) -> dict[str, Any] | None:
        """The batch (the fields of a SNAPSHOT_BLOCKING message), emptied; None: nothing."""
        if not self.count:
            return None
        batch = {"blocked_s": round(self.seconds, 6), "snapshots": self.count,
                 "step": self.step, "ended_at": self.ended_at}
        self.seconds, self.count, self.step, self.ended_at = 0.0, 0, None, None
        return batch

    def put_back(self, batch: dict[str, Any]) -> None:
        """A batch that could not be sent goes with the next one."""
        self.seconds += float(batch["blocked_s"])
        self.count += int(batch["snapshots"])
        if self.step is None:  # nothing newer was counted since
            self.step, self.ended_at = batch["step"], batch["ended_at"]


class SnapshotTimer:
    """Times the snapshots of one rank's MemoryTier; sends only on rank 0 under a launcher
    (the job's figure, as rank 0's CheckpointSaved is the saves')."""

    def __init__(self, rank: int) -> None:
        self._on = rank == 0 and channel.available()
        self._pid = os.getpid()  # a forked child (a DataLoader worker) sends nothing
        self._tally = BlockingTally()
        if self._on:
            atexit.register(self.flush)
            _live.add(self)

    @contextlib.contextmanager
    def timed(self, step: int) -> Iterator[None]:
        t0 = time.monotonic()
        try:
            yield
        finally:
            if self._on:
                now = time.monotonic()
                self._send(self._tally.add(step, now - t0, time.time(), now))

    def flush(self) -> None:
        """Send what was counted since the last report (at exit, or when the tier closes)."""
        if self._on:
            self._send(self._tally.take())

    def close(self) -> None:
        self.flush()
        if self._on:
            atexit.unregister(self.flush)
            _live.discard(self)
            self._on = False

    def _send(self, batch: dict[str, Any] | None) -> None:
        if batch is None or os.getpid() != self._pid:
            return
        if not channel.send(MessageKind.SNAPSHOT_BLOCKING, **batch):
            self._tally.put_back(batch)  # the agent's queue was full: with the next one


_live: weakref.WeakSet[SnapshotTimer] = weakref.WeakSet()  # the timers that send


def flush_reports() -> None:
    """Send every timer's unreported blocking now: a rank that ends with os._exit (its stop
    after the save on the way out) runs no atexit."""
    for timer in list(_live):
        timer.flush()
