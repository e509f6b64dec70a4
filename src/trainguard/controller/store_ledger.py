"""The job store's reads and writes for the goodput ledger (trainguard.goodput): progress
samples, and chosen fields of one kind of event without decoding whole events (a long job
has tens of thousands of CheckpointSaved events), or the newest event of a few kinds (one
indexed read: events_by_reason). A mixin of JobStore."""

from __future__ import annotations

import sqlite3
from contextlib import AbstractContextManager
from datetime import datetime
from pathlib import Path
from typing import Any

from trainguard.controller.store_rows import decoding, event_from_row
from trainguard.records import Event, Reason

# events read back to find the last before a time (a relaunch writes a few before it looks)
EVENTS_LOOKED_AT = 1000


class LedgerTables:
    _conn: sqlite3.Connection
    path: Path

    def _errors(self, action: str) -> AbstractContextManager[None]:
        raise NotImplementedError  # JobStore's: sqlite errors as StoreError

    def _tx(self, action: str) -> AbstractContextManager[None]:
        raise NotImplementedError  # JobStore's: one short write transaction

    def _schema(self) -> int:
        raise NotImplementedError  # JobStore's: the schema version now (review 55 #7)

    def _one(self, since: int, what: str, sql: str, params: tuple[Any, ...] = ()
             ) -> tuple[Any, ...] | None:
        """The first row a read returns; None without one, or in a store older than schema
        `since` (that lacks what it reads)."""
        if self._schema() < since:
            return None
        with self._errors(f"read {what} from"):
            row = self._conn.execute(sql, params).fetchone()
        return None if row is None else tuple(row)

    def _decoded(self, what: str) -> AbstractContextManager[None]:
        return decoding(self.path, what)  # a value that does not decode: StoreError

    def add_progress(self, samples: list[tuple[int, int, float]]) -> None:
        """Append (attempt, step, epoch seconds) samples: a step an attempt reached, and when."""
        if samples:
            with self._tx("write progress to"):
                self._conn.executemany(
                    "INSERT INTO progress (attempt, step, at) VALUES (?, ?, ?)", samples)

    def progress(self) -> list[tuple[int, int, float]]:
        """Every progress sample, by time; [] before schema 4."""
        if self._schema() < 4:
            return []
        with self._errors("read progress from"):
            rows = self._conn.execute(
                "SELECT attempt, step, at FROM progress ORDER BY at, rowid").fetchall()
        with self._decoded("progress"):
            return [(int(a), int(s), float(t)) for a, s, t in rows]

    def last_progress_time(self) -> float | None:
        """When the newest progress sample was taken (epoch seconds); None without one."""
        row = self._one(4, "progress", "SELECT MAX(at) FROM progress")
        with self._decoded("progress"):
            return None if row is None or row[0] is None else float(row[0])

    def last_sample(self, attempt: int) -> tuple[int, int, float] | None:
        """The newest progress sample (attempt, step, time) of `attempt`; None without one."""
        row = self._one(4, "progress", "SELECT attempt, step, at FROM progress WHERE attempt = ? "
                        "ORDER BY at DESC, rowid DESC LIMIT 1", (attempt,))
        with self._decoded("progress"):
            return None if row is None else (int(row[0]), int(row[1]), float(row[2]))

    def add_snapshot_blocking(self, rows: list[tuple[int, int | None, float, float, int]]
                              ) -> None:
        """Append (attempt, rank, epoch seconds, blocked seconds, snapshots) rows: what a rank's
        memory snapshots held its loop for since its last report, and when the last returned."""
        if rows:
            with self._tx("write snapshot blocking to"):
                self._conn.executemany(
                    "INSERT INTO snapshot_blocking (attempt, rank, at, blocked_s, snapshots) "
                    "VALUES (?, ?, ?, ?, ?)", rows)

    def snapshot_blocking(self, rank: int = 0) -> list[tuple[int, float, float, int]]:
        """`rank`'s reports (attempt, epoch seconds, blocked seconds, snapshots), by time; []
        before schema 6."""
        if self._schema() < 6:
            return []
        with self._errors("read snapshot blocking from"):
            rows = self._conn.execute(
                "SELECT attempt, at, blocked_s, snapshots FROM snapshot_blocking WHERE rank = ? "
                "ORDER BY at, rowid", (rank,)).fetchall()
        with self._decoded("snapshot blocking"):
            return [(int(a), float(t), float(b), int(n)) for a, t, b, n in rows]

    def event_values(self, reason: str, keys: tuple[str, ...]
                     ) -> list[tuple[float, int | None, tuple[Any, ...]]]:
        """(epoch seconds, attempt, the values of `keys` in its data) of each event of
        `reason`, oldest first; a key the event's data lacks reads None."""
        if self._schema() < 2:
            return []
        picks = "".join(", json_extract(data, ?)" for _ in keys)
        with self._errors("read events from"):
            rows = self._conn.execute(
                f"SELECT time, attempt{picks} FROM events WHERE reason = ? ORDER BY id",
                (*(f'$."{k}"' for k in keys), reason)).fetchall()
        with self._decoded("events"):
            return [(datetime.fromisoformat(r[0]).timestamp(), r[1], tuple(r[2:])) for r in rows]

    def last_checkpoint(self) -> tuple[int, str] | None:
        """(step, ISO time) of the newest checkpoint committed (`CheckpointSaved`), or None."""
        row = self._one(2, "events", "SELECT json_extract(data, '$.step'), time FROM events "
                        "WHERE reason = ? ORDER BY id DESC LIMIT 1",
                        (Reason.CHECKPOINT_SAVED.value,))
        return (row[0], row[1]) if row is not None and isinstance(row[0], int) else None

    def last_checkpoint_location(self) -> str | None:
        """Where the newest checkpoint committed (`CheckpointSaved`) was written, or None."""
        row = self._one(1, "events", "SELECT json_extract(data, '$.location') FROM events "
                        "WHERE reason = ? ORDER BY id DESC LIMIT 1",
                        (Reason.CHECKPOINT_SAVED.value,))
        return row[0] if row is not None and isinstance(row[0], str) else None

    def last_event(self, reasons: tuple[str, ...]) -> Event | None:
        """The newest event of one of `reasons` (one row of the index by reason), or None."""
        row = self._one(0, "events", "SELECT time, level, reason, message, job, node, rank, "
                        f"attempt, {'data' if self._schema() >= 2 else 'NULL'} FROM events "
                        f"WHERE reason IN ({', '.join('?' * len(reasons))}) "
                        "ORDER BY id DESC LIMIT 1", reasons)
        with self._decoded("events"):
            return None if row is None else event_from_row(row)

    def last_event_time(self, before: float | None = None) -> float | None:
        """When the newest event was recorded (epoch seconds), of those before `before` if
        given (a relaunch's own events are no sign of its lost launch's life: walk-through
        42 #1); None without one (among the newest EVENTS_LOOKED_AT)."""
        with self._errors("read events from"):
            rows = self._conn.execute("SELECT time FROM events ORDER BY id DESC LIMIT ?",
                                      (1 if before is None else EVENTS_LOOKED_AT,)).fetchall()
        with self._decoded("events"):
            times = (datetime.fromisoformat(r[0]).timestamp() for r in rows)
            return next((t for t in times if before is None or t < before), None)
