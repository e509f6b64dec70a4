"""Bounded reads of a job's events for the dashboard: a page after an id, the newest N,
the newest N of some reasons, counts. `JobStore.events(after_id)` returns every row after
the id, and a job can hold 100k events: a page view must not decode them all.

Read-only, its own connection (the store's file in WAL; `mode=ro`), rows decoded into
`trainguard.records.Event` by the store's own `event_from_row`.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

from trainguard.controller.store import db_path
from trainguard.controller.store_file import BUSY_TIMEOUT_S
from trainguard.controller.store_rows import decoding, event_from_row
from trainguard.errors import StoreError
from trainguard.records import Event

PAGE = 500  # the most events one read returns
_COLUMNS = "id, time, level, reason, message, job, node, rank, attempt"


class EventLog:
    """The events table of one job store, read in bounded pages."""

    def __init__(self, job_dir: Path) -> None:
        self.path = path = db_path(job_dir)
        query = "mode=ro" if os.access(path.parent, os.W_OK) else "mode=ro&immutable=1"
        try:
            self._conn = sqlite3.connect(f"{path.resolve().as_uri()}?{query}", uri=True,
                                         timeout=BUSY_TIMEOUT_S, isolation_level=None,
                                         check_same_thread=False)
            version = int(self._conn.execute("PRAGMA user_version").fetchone()[0])
        except sqlite3.Error as e:
            raise StoreError(f"cannot read the events of {path}: {e}") from e
        self._select = f"SELECT {_COLUMNS}, {'data' if version >= 2 else 'NULL'} FROM events"

    def last_id(self) -> int:
        """The newest event's id (0: none yet)."""
        row = self._query("SELECT MAX(id) FROM events", ())
        return int(row[0][0] or 0) if row else 0

    def after(self, after_id: int, limit: int = PAGE) -> list[tuple[int, Event]]:
        """Up to `limit` events with an id above `after_id`, oldest first."""
        rows = self._query(f"{self._select} WHERE id > ? ORDER BY id LIMIT ?",
                           (after_id, _bounded(limit)))
        return self._decoded(rows)

    def newest(self, limit: int, reasons: Iterable[str] = ()) -> list[tuple[int, Event]]:
        """The newest `limit` events (of `reasons` only, when given), oldest first."""
        where, args = _reason_filter(reasons)
        rows = self._query(f"{self._select} {where} ORDER BY id DESC LIMIT ?",
                           (*args, _bounded(limit)))
        return self._decoded(rows[::-1])

    def count(self, reasons: Iterable[str] = ()) -> int:
        where, args = _reason_filter(reasons)
        rows = self._query(f"SELECT COUNT(*) FROM events {where}", args)
        return int(rows[0][0]) if rows else 0

    def _query(self, sql: str, args: tuple[object, ...]) -> list[tuple[Any, ...]]:
        try:
            return self._conn.execute(sql, args).fetchall()
        except sqlite3.Error as e:
            raise StoreError(f"cannot read events: {e}") from e

    def _decoded(self, rows: list[tuple[Any, ...]]) -> list[tuple[int, Event]]:
        """The rows as events; one that does not decode is a StoreError (store_rows)."""
        with decoding(self.path, "events"):
            return [(int(r[0]), event_from_row(r[1:])) for r in rows]

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _bounded(limit: int) -> int:
    return max(0, min(int(limit), PAGE))


def _reason_filter(reasons: Iterable[str]) -> tuple[str, tuple[str, ...]]:
    names = tuple(reasons)
    if not names:
        return "", ()
    return f"WHERE reason IN ({', '.join('?' * len(names))})", names
