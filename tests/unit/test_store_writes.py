"""The recorder's best-effort writes (controller/store_writes.py) and the room kept for the
job's end on a disk that fills up (controller/reserve.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainguard.controller.reserve import Reserve
from trainguard.controller.store_writes import StoreWrites
from trainguard.errors import StoreError
from trainguard.records import Event, Involved, Level, utcnow


class FullStore:
    """A job store on a full disk: every write fails (reads work)."""

    path = Path("/jobs/j/trainguard.db")

    def add_event(self, ev: Event) -> None:
        raise StoreError("cannot add an event to the job store: database or disk is full")

    def set_meta(self, **values: Any) -> None:
        raise StoreError("cannot write meta to the job store: database or disk is full")

    def has_message(self, message_id: str) -> bool:
        return False


def event(text: str) -> Event:
    return Event(utcnow(), Level.INFO, "JobSucceeded", text, Involved(job="j"))


def test_what_the_store_never_took_is_said_at_the_end_with_what_status_will_read(
        tmp_path: Path) -> None:
    said: list[Event] = []
    w = StoreWrites(FullStore(), "j", tmp_path, said.append)  # type: ignore[arg-type]
    assert w.reserve.keep() and w.reserve.path.stat().st_size == w.reserve.nbytes
    w.add_event(event("job succeeded"))
    assert w.failing and w.unwritten() and said[0].reason == "StoreWriteFailed"
    w.last_word()  # writes failed: the room goes to the final writes
    assert not w.reserve.path.exists()
    w.set_meta(state="succeeded", exit_code=0)
    w.ended("succeeded", 0)
    last = said[-1].message
    assert last.startswith("the job ended succeeded (exit 0), but 2 event(s) and its end "
                           "could not be written to the job store /jobs/j/trainguard.db: "
                           "`trainguard status` will read the job as active, then lost"), last


def test_a_store_that_took_every_write_keeps_its_room_until_the_end(tmp_path: Path) -> None:
    class Store(FullStore):
        def add_event(self, ev: Event) -> None:
            pass

        def set_meta(self, **values: Any) -> None:
            pass

    said: list[Event] = []
    w = StoreWrites(Store(), "j", tmp_path, said.append)  # type: ignore[arg-type]
    w.reserve.keep()
    w.add_event(event("job succeeded"))
    w.last_word()
    assert w.reserve.path.exists()  # nothing failed: kept until the end
    w.ended("succeeded", 0)
    assert not w.reserve.path.exists() and said == []


def test_no_room_for_the_reserve_leaves_no_file(tmp_path: Path) -> None:
    r = Reserve(tmp_path / "missing-dir")  # cannot be created: the job runs without it
    assert not r.keep() and not r.path.exists()
