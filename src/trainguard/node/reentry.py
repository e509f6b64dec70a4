"""Whose steps count: which ranks re-entered their training function after an in-process
restart, and which report their own progress.

After `restart_ranks` the agent's progress starts again: the first step from then on ends
the incident. A surviving rank may still finish a step of the old process group before it
reads the RESTART tell (its collective had completed before the peer died); that step is
not recovery. A rank's steps count again once it said it entered the new generation
(MessageKind.RESILIENT, which run_resilient sends before its first step). The channel's
reader thread tells this as each message arrives, ahead of the log line of that step.

A rank that reports its steps itself (trainguard.progress: a trainer integration's global
step) is not read from its log lines any more: an evaluation's progress bar (`500/500`) reads
like steps, and an HF job that evaluates showed "step 1500" of 30, and 490 steps lost for 3
(walk-through 29).
"""

from __future__ import annotations

import threading
from typing import Any

from trainguard.worker.contract import MessageKind


class ReEntry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[int, int] = {}  # rank -> the generation its steps wait for
        self._reporting: set[int] = set()  # ranks that sent their own progress

    def expect(self, ranks: list[int], generation: int) -> None:
        """An in-process restart to `generation`: these ranks' steps wait for their entry."""
        with self._lock:
            self._waiting = dict.fromkeys(ranks, generation)

    def clear(self) -> None:
        """A new attempt: nothing waits, and no rank reported its progress yet."""
        with self._lock:
            self._waiting, self._reporting = {}, set()

    def seen(self, msg: dict[str, Any]) -> None:
        """A worker message as it arrives (ChannelServer's on_message)."""
        rank = msg.get("rank")
        if msg.get("kind") == MessageKind.PROGRESS and isinstance(rank, int):
            with self._lock:
                self._reporting.add(rank)
        if msg.get("kind") != MessageKind.RESILIENT:
            return
        generation = msg.get("generation")
        if not isinstance(rank, int) or not isinstance(generation, int):
            return
        with self._lock:
            want = self._waiting.get(rank)
            if want is not None and generation >= want:
                del self._waiting[rank]

    def counts(self, rank: int) -> bool:
        """Whether a step of this rank counts as progress now."""
        with self._lock:
            return rank not in self._waiting

    def reports_itself(self, rank: int) -> bool:
        """Whether this rank sent its own progress in this attempt (its log lines' steps
        are not read then)."""
        with self._lock:
            return rank in self._reporting
