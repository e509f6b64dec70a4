"""The job store: one SQLite file per job (JOB_DIR/trainguard.db) in WAL mode.

One writer (the launcher's controller) records meta, events, running records, worker rows
and node rows as things happen; any number of readers (`trainguard events|recovery|status`) read
it while the job runs and after it ends. Every method is one short transaction.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, TypeAlias

from trainguard.controller.shown import HANG_REASONS, hang_left_running, shown_state
from trainguard.controller.store_file import (
    BUSY_TIMEOUT_S,
    connect_readonly,
    full_disk,
    remove_store_files,
    store_fix,
)
from trainguard.controller.store_ledger import LedgerTables
from trainguard.controller.store_rows import (
    NODE_COLUMNS,
    WORKER_COLUMNS,
    NodeRow,
    WorkerRow,
    check_nodes,
    decoding,
    empty_store,
    event_from_row,
    meta_from_rows,
    node_from_row,
    running_to_json,
    to_row,
    worker_from_row,
)
from trainguard.controller.store_rows import db_path as db_path
from trainguard.controller.store_rows import holds_job_dirs as holds_job_dirs
from trainguard.controller.store_schema import INDEXES, MIGRATIONS, SCHEMA, WORKER_COLUMN_SINCE
from trainguard.controller.store_schema import SCHEMA_VERSION as SCHEMA_VERSION
from trainguard.errors import StoreError
from trainguard.paths import DB_NAME
from trainguard.records import Event, RunningRecord

MetaValue: TypeAlias = (str | int | float | bool | list[str] | dict[str, int]
                        | dict[str, dict[str, int]] | None)


def other_job(job_dir: Path, existing: str, run_id: str) -> StoreError:
    """A run id that is not the one of the job JOB_DIR holds (`run` and `run --dry-run`)."""
    return StoreError(
        f"{job_dir} holds the job {existing!r}, not {run_id!r}: drop --run-id "
        f"(or pass --run-id {existing}) to continue that job, or use another --job-dir"
    )


class JobStore(LedgerTables):
    """A connection to one job's store; build it with `create` (writer) or `open` (reader)."""

    def __init__(self, conn: sqlite3.Connection, path: Path, readonly: bool) -> None:
        self._conn = conn
        self._version = SCHEMA_VERSION
        self._lock = threading.RLock()
        self.path = path
        self.readonly = readonly

    @property
    def job_dir(self) -> Path:
        return self.path.parent

    # -- opening ----------------------------------------------------------------

    @classmethod
    def create(cls, job_dir: Path, run_id: str) -> JobStore:
        """Open JOB_DIR's store for writing, making it if absent; refuse another run's store."""
        path = db_path(job_dir)
        made = not path.exists()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(
                path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
            )
        except (OSError, sqlite3.Error) as e:
            fix = store_fix(e, path) if isinstance(e, sqlite3.Error) else ""
            raise StoreError(f"cannot create the job store {path}: {e}{fix}") from e
        store = cls(conn, path, readonly=False)
        try:
            store._init_writer(run_id)
        except BaseException as e:
            conn.close()
            if made and full_disk(e):  # a store half made on a full disk is no job (later
                # reads met it); never another launch's, made meanwhile (review 49 #7)
                remove_store_files(path)
            raise
        return store

    @classmethod
    def open(cls, job_dir: Path) -> JobStore:
        """Open a job's store read-only; `job_dir` may also be the db file itself."""
        job_dir = Path(job_dir)
        path = job_dir if job_dir.is_file() else db_path(job_dir)
        if not path.is_file() or path.name != DB_NAME:
            what = (f"{job_dir} is a file, not a job dir" if job_dir.is_file() else
                    f"no trainguard job at {job_dir} (expected {path})")
            fix = (f"it holds job dirs: `trainguard ls {job_dir}` lists them" if holds_job_dirs(
                job_dir) else "pass the job dir printed by `trainguard run` (`trainguard ls DIR` "
                "lists the jobs in DIR, ./trainguard-runs by default)")
            raise StoreError(f"{what}; {fix}")
        conn = connect_readonly(path)
        store = cls(conn, path, readonly=True)
        try:
            if store._check_version() == 0:
                raise StoreError(empty_store(path))
        except BaseException:
            conn.close()
            raise
        return store

    def _init_writer(self, run_id: str) -> None:
        with self._errors("open"):
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
        with self._tx("create"):
            version = self._check_version()
            if version == 0:
                for statement in SCHEMA:
                    self._conn.execute(statement)
            else:
                for v in range(version, SCHEMA_VERSION):
                    for statement in MIGRATIONS[v]:
                        self._conn.execute(statement)
            for statement in INDEXES:
                self._conn.execute(statement)
            self._conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            self._version = SCHEMA_VERSION
            existing = self.meta().get("run_id")
            if existing is None:
                self._write_meta({"run_id": run_id})
        if existing is not None and existing != run_id:
            raise other_job(self.job_dir, existing, run_id)

    def _check_version(self) -> int:
        with self._errors("read"):
            version = int(self._conn.execute("PRAGMA user_version").fetchone()[0])
        self._version = version
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path} has store schema version {version}, newer than this trainguard "
                f"understands ({SCHEMA_VERSION}); read it with a newer trainguard"
            )
        return version

    def _schema(self) -> int:
        """The store's schema version now: a reader of an older store asks again, since a
        newer launcher taking the job over migrates it meanwhile (review 54 #8: a dashboard
        opened on a schema-6 store read every rank's stopper as NULL until reopened)."""
        return self._check_version() if self._version < SCHEMA_VERSION else self._version

    # -- meta -------------------------------------------------------------------

    def set_meta(self, **values: MetaValue) -> None:
        """Set meta keys (JSON-encoded); a value of None is stored as null."""
        with self._tx("write meta to"):
            self._write_meta(values)

    def _write_meta(self, values: dict[str, MetaValue]) -> None:
        self._conn.executemany(
            "INSERT INTO meta (key, value) VALUES (?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            [(k, json.dumps(v)) for k, v in values.items()],
        )

    def meta(self) -> dict[str, Any]:
        with self._errors("read meta from"):
            rows = self._conn.execute("SELECT key, value FROM meta").fetchall()
        with decoding(self.path, "meta"):
            return meta_from_rows(rows)

    # -- events -----------------------------------------------------------------

    def add_event(self, ev: Event) -> int:
        """Append an event; returns its id (ids only grow)."""
        inv = ev.involved
        with self._tx("add an event to"):
            cur = self._conn.execute(
                "INSERT INTO events (time, level, reason, message, job, node, rank, attempt, "
                "data) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    ev.time.isoformat(),
                    ev.level.value,
                    ev.reason,
                    ev.message,
                    inv.job,
                    inv.node,
                    inv.rank,
                    inv.attempt,
                    None if ev.data is None else json.dumps(ev.data),
                ),
            )
        return int(cur.lastrowid or 0)

    def events(self, after_id: int = 0,
               reasons: tuple[str, ...] = ()) -> list[tuple[int, Event]]:
        """Events with an id above `after_id` (and one of `reasons`, if given), oldest first."""
        only = f" AND reason IN ({', '.join('?' * len(reasons))})" if reasons else ""
        with self._errors("read events from"):
            rows = self._conn.execute(
                f"SELECT id, time, level, reason, message, job, node, rank, attempt, "
                f"{'data' if self._schema() >= 2 else 'NULL'} "
                f"FROM events WHERE id > ?{only} ORDER BY id",
                (after_id, *reasons),
            ).fetchall()
        with decoding(self.path, "events"):
            return [(row[0], event_from_row(row[1:])) for row in rows]

    def hang_left_running(self, meta: dict[str, Any]) -> dict[str, Any] | None:
        """A confirmed hang left running in the current attempt (`meta`: this store's, as
        read): what `status`, the dashboard and the metrics show (store_rows)."""
        return hang_left_running(shown_state(meta), meta.get("attempt"),
                                 [ev for _, ev in self.events(reasons=HANG_REASONS)])

    def has_message(self, message_id: str) -> bool:
        """Is an event of the worker message with this id (node/outbox.py) recorded? (Asked
        only for messages sent again after a reconnect: a scan is fine.)"""
        return self._one(2, "events", "SELECT 1 FROM events WHERE data IS NOT NULL AND "
                         "json_extract(data, '$.message_id') = ? LIMIT 1",
                         (message_id,)) is not None

    # -- running records --------------------------------------------------------

    def put_running(self, rec: RunningRecord) -> None:
        """Insert or replace the running record of `rec.attempt`, recover records included."""
        data = json.dumps(running_to_json(rec))
        with self._tx("write a running record to"):
            self._conn.execute(
                "INSERT INTO running_records (attempt, data) VALUES (?, ?) "
                "ON CONFLICT(attempt) DO UPDATE SET data = excluded.data",
                (rec.attempt, data),
            )

    def running_records(self) -> list[RunningRecord]:
        """All running records, by attempt."""
        with self._errors("read running records from"):
            rows = self._conn.execute(
                "SELECT data FROM running_records ORDER BY attempt"
            ).fetchall()
        with decoding(self.path, "running records"):
            return [RunningRecord.from_dict(json.loads(r[0])) for r in rows]

    # -- workers ----------------------------------------------------------------

    def put_workers(self, attempt: int, workers: list[WorkerRow]) -> None:
        """Replace the worker rows of `attempt`."""
        bad = [w.rank for w in workers if w.attempt != attempt]
        if bad:
            raise ValueError(f"put_workers({attempt}): rows of ranks {bad} have another attempt")
        rows = [to_row(w) for w in workers]
        marks = ", ".join("?" * len(WORKER_COLUMNS))
        with self._tx("write workers to"):
            self._conn.execute("DELETE FROM workers WHERE attempt = ?", (attempt,))
            self._conn.executemany(
                f"INSERT INTO workers ({', '.join(WORKER_COLUMNS)}) VALUES ({marks})", rows
            )

    def workers(self, attempt: int | None = None) -> list[WorkerRow]:
        """Worker rows of `attempt` (the latest attempt with rows when None), by rank."""
        where = "(SELECT MAX(attempt) FROM workers)" if attempt is None else "?"
        params: tuple[int, ...] = () if attempt is None else (attempt,)
        return self._worker_rows(f"WHERE attempt = {where} ORDER BY rank", params)

    def all_workers(self) -> list[WorkerRow]:
        """Worker rows of every attempt, by attempt and rank."""
        return self._worker_rows("ORDER BY attempt, rank", ())

    def _worker_rows(self, tail: str, params: tuple[int, ...]) -> list[WorkerRow]:
        version = self._schema()
        cols = [c if version >= WORKER_COLUMN_SINCE.get(c, 0) else "NULL" for c in WORKER_COLUMNS]
        with self._errors("read workers from"):
            rows = self._conn.execute(
                f"SELECT {', '.join(cols)} FROM workers {tail}", params).fetchall()
        with decoding(self.path, "workers"):
            return [worker_from_row(r) for r in rows]

    # -- nodes ------------------------------------------------------------------

    def put_nodes(self, nodes: list[NodeRow], replace: bool = False) -> None:
        """Insert or update the rows of `nodes` by name; other nodes' rows stay, or with
        `replace` go (the job now runs on these nodes only, e.g. requeued elsewhere)."""
        check_nodes(nodes)
        rows = [to_row(n) for n in nodes]
        marks = ", ".join("?" * len(NODE_COLUMNS))
        updates = ", ".join(f"{c} = excluded.{c}" for c in NODE_COLUMNS if c != "name")
        with self._tx("write nodes to"):
            if replace:
                names = [n.name for n in nodes]
                self._conn.execute(f"DELETE FROM nodes WHERE name NOT IN "
                                   f"({', '.join('?' * len(names))})", names)
            self._conn.executemany(
                f"INSERT INTO nodes ({', '.join(NODE_COLUMNS)}) VALUES ({marks}) "
                f"ON CONFLICT(name) DO UPDATE SET {updates}",
                rows,
            )

    def nodes(self) -> list[NodeRow]:
        """Every node, by slot (nodes without one last), then name; [] before schema 3."""
        if self._schema() < 3:
            return []
        with self._errors("read nodes from"):
            rows = self._conn.execute(
                f"SELECT {', '.join(NODE_COLUMNS)} FROM nodes "
                "ORDER BY slot IS NULL, slot, name"
            ).fetchall()
        with decoding(self.path, "nodes"):
            return [node_from_row(r) for r in rows]

    # -- lifetime ---------------------------------------------------------------

    def close(self) -> None:
        """Close; the writer first folds the WAL into the db file and leaves WAL mode, so
        that trainguard.db alone (an archived job) holds everything and readers of the
        ended job make no -wal and -shm files beside it (the next writer turns WAL on
        again; while a reader holds the file the mode stays, which is harmless)."""
        with self._lock:
            if not self.readonly:
                with contextlib.suppress(sqlite3.Error):
                    self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                    self._conn.execute("PRAGMA journal_mode=DELETE")
            self._conn.close()

    def __enter__(self) -> JobStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        """Hold the connection and turn sqlite errors into StoreError naming the file."""
        with self._lock:
            try:
                yield
            except sqlite3.Error as e:
                raise StoreError(f"cannot {action} the job store {self.path}: {e}"
                                 f"{store_fix(e, self.path)}") from e

    @contextmanager
    def _tx(self, action: str) -> Iterator[None]:
        """One short write transaction."""
        if self.readonly:
            raise StoreError(f"cannot {action} {self.path}: it was opened read-only")
        with self._errors(action):
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield
                self._conn.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise


__all__ = ["JobStore", "MetaValue", "NodeRow", "StoreError", "WorkerRow"]
