"""The recorder's writes once the job runs: best effort, nothing dropped while it lives.

A failed store write (a full disk, an I/O error) never ends a running job: the console says
so (StoreWriteFailed, at most once a minute), events wait in memory (up to MAX_UNWRITTEN),
meta values go with the next meta write, and every write is tried again later. Room is kept
on the store's disk for the job's end (controller/reserve.py); what still could not be
written when the job ends is said on the console, with what `trainguard status` will read.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from trainguard.controller.reserve import Reserve
from trainguard.controller.store import JobStore
from trainguard.errors import StoreError
from trainguard.records import Event, Involved, Level, Reason, utcnow

STORE_WARN_EVERY_S = 60.0
MAX_UNWRITTEN = 10_000  # events kept in memory while the store cannot be written


class StoreWrites:
    def __init__(self, store: JobStore, run_id: str, job_dir: Path,
                 on_event: Callable[[Event], None] | None = None) -> None:
        self.store, self._run_id, self._on_event = store, run_id, on_event
        self.reserve = Reserve(job_dir)
        self.failing = False  # a write failed since the job started
        self._unwritten: deque[Event] = deque(maxlen=MAX_UNWRITTEN)
        self._meta_pending: dict[str, Any] = {}
        self._warned = -STORE_WARN_EVERY_S

    def add_event(self, ev: Event) -> None:
        self._unwritten.append(ev)
        with self.best_effort():
            while self._unwritten:
                self.store.add_event(self._unwritten[0])
                self._unwritten.popleft()

    def set_meta(self, **values: Any) -> None:
        """What could not be written goes with the next meta write."""
        self._meta_pending.update(values)
        with self.best_effort():
            self.store.set_meta(**self._meta_pending)
            self._meta_pending.clear()

    def recorded(self, message_id: str) -> bool:
        """Is an event of this worker message in the store, or waiting to be written (a
        store that cannot be read: no)?"""
        if any((ev.data or {}).get("message_id") == message_id for ev in self._unwritten):
            return True
        try:
            return self.store.has_message(message_id)
        except StoreError:
            return False

    def unwritten(self) -> bool:
        """Events wait for the store to take writes again: worker messages are not
        acknowledged meanwhile (controller/fleet.py), so a controller that dies now loses
        none of theirs."""
        return bool(self._unwritten)

    @contextlib.contextmanager
    def best_effort(self) -> Iterator[None]:
        """A store write that may fail while the job runs: warn, and let it be retried."""
        try:
            yield
        except (StoreError, OverflowError, OSError) as e:
            self.failed(e)

    def failed(self, e: Exception) -> None:
        """Say so (at most once a minute); the write is tried again later."""
        self.failing = True
        if time.monotonic() - self._warned < STORE_WARN_EVERY_S:
            return
        self._warned = time.monotonic()
        ev = Event(utcnow(), Level.WARNING, Reason.STORE_WRITE_FAILED.value,
                   f"cannot write the job store ({e}); the job goes on, "
                   f"{len(self._unwritten)} event(s) wait and every write is retried",
                   Involved(job=self._run_id))
        if len(self._unwritten) < MAX_UNWRITTEN:
            self._unwritten.append(ev)  # written once the store takes writes again
        self._say(ev)

    def last_word(self) -> None:
        """Before the job's final writes: the room kept for them is given back to the disk
        when writes have been failing."""
        if self.failing or self._unwritten or self._meta_pending:
            self.reserve.release()

    def ended(self, state: str, code: int) -> None:
        """After the job's final writes: the room goes; what still is not written is said
        (on the console only: the store takes nothing)."""
        self.reserve.release()
        events = f"{len(self._unwritten)} event(s)" if self._unwritten else ""
        if "state" in self._meta_pending:
            what = " and its end" if events else "its end"
            then = ("`trainguard status` will read the job as active, then lost, and the same "
                    "command would run it again")
        elif events:
            what, then = "", "its end was written"
        else:
            return
        self._say(Event(utcnow(), Level.WARNING, Reason.STORE_WRITE_FAILED.value,
                        f"the job ended {state} (exit {code}), but {events}{what} could not be "
                        f"written to the job store {self.store.path}: {then}. Free space on "
                        "that disk (or move the job dir to one with room)",
                        Involved(job=self._run_id)))

    def _say(self, ev: Event) -> None:
        if self._on_event is not None:
            self._on_event(ev)
