"""Node rows of the job store (schema 3): upsert, order, migration from 2 and 1, old readers."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from trainguard.controller.store import SCHEMA_VERSION, JobStore, NodeRow, WorkerRow
from trainguard.errors import StoreError
from trainguard.records import Event, Involved, Level
from trainguard.states import StopCause

T0 = datetime(2025, 3, 1, 12, 0, 0, 123456, tzinfo=timezone.utc)

# The store of trainguard before nodes, as `git show` gives it: version 2, and version 1
# (no events.data, no workers.oom_killed).
V2_SCHEMA = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time TEXT NOT NULL, level TEXT NOT NULL, reason TEXT NOT NULL, message TEXT NOT NULL,
    job TEXT NOT NULL, node TEXT, rank INTEGER, attempt INTEGER, data TEXT
    )""",
    "CREATE TABLE running_records (attempt INTEGER PRIMARY KEY, data TEXT NOT NULL)",
    """CREATE TABLE workers (
    attempt INTEGER NOT NULL, rank INTEGER NOT NULL, local_rank INTEGER NOT NULL,
    node TEXT NOT NULL, pid INTEGER, state TEXT NOT NULL, exit_code INTEGER, signal TEXT,
    started_at TEXT, ended_at TEXT, start_count INTEGER NOT NULL, oom_killed INTEGER,
    PRIMARY KEY (attempt, rank)
    )""",
)
NODES_V3 = """CREATE TABLE nodes (
    name TEXT PRIMARY KEY, host TEXT NOT NULL, state TEXT NOT NULL, agent_pid INTEGER,
    slot INTEGER, reason TEXT, updated_at TEXT NOT NULL, backend TEXT NOT NULL,
    times_implicated INTEGER NOT NULL DEFAULT 0
    )"""
PROGRESS_V4 = ("CREATE TABLE progress "
               "(attempt INTEGER NOT NULL, step INTEGER NOT NULL, at REAL NOT NULL)")
V1_SCHEMA = tuple(
    s.replace(", data TEXT", "").replace(", oom_killed INTEGER", "") for s in V2_SCHEMA
)


def make_old_store(job_dir: Path, version: int) -> Path:
    """A store file as trainguard of schema `version` (1 to 4) left it, with one of each row."""
    job_dir.mkdir(parents=True, exist_ok=True)
    path = job_dir / "trainguard.db"
    raw = sqlite3.connect(path)
    for statement in V1_SCHEMA if version == 1 else V2_SCHEMA:
        raw.execute(statement)
    if version >= 3:
        raw.execute(NODES_V3)
    if version >= 4:
        raw.execute(PROGRESS_V4)
    raw.execute("INSERT INTO meta VALUES ('run_id', ?), ('state', ?)",
                (json.dumps("run-1"), json.dumps("succeeded")))
    raw.execute("INSERT INTO events (time, level, reason, message, job, node, rank, attempt) "
                "VALUES (?, 'Info', 'JobCreated', 'made.', 'run-1', NULL, NULL, NULL)",
                (T0.isoformat(),))
    raw.execute("INSERT INTO workers (attempt, rank, local_rank, node, pid, state, started_at, "
                "start_count) VALUES (0, 0, 0, 'node0', 4100, 'succeeded', ?, 1)",
                (T0.isoformat(),))
    raw.execute(f"PRAGMA user_version={version}")
    raw.commit()
    raw.close()
    return path


def user_version(path: Path) -> int:
    raw = sqlite3.connect(path)
    try:
        return int(raw.execute("PRAGMA user_version").fetchone()[0])
    finally:
        raw.close()


def node(name: str, slot: int | None, state: str = "healthy", **kw: object) -> NodeRow:
    row = NodeRow(name=name, host=f"{name}.cluster", state=state, agent_pid=7000 + len(name),
                  slot=slot, reason=None, updated_at=T0, backend="local")
    return replace(row, **kw)  # type: ignore[arg-type]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[JobStore]:
    with JobStore.create(tmp_path / "job", "run-1") as s:
        yield s


def test_the_schema_is_version_7(store: JobStore) -> None:
    assert SCHEMA_VERSION == 7
    assert user_version(store.path) == 7
    assert store.nodes() == [] and store.progress() == [] and store.snapshot_blocking() == []


def test_node_rows_round_trip_exactly_times_and_zones_included(store: JobStore) -> None:
    cest = timezone(timedelta(hours=2))
    lost = node("n1", None, "lost", agent_pid=None, reason="agent silent for 30s",
                updated_at=T0.astimezone(cest), backend="slurm", times_implicated=2)
    store.put_nodes([lost])
    assert store.nodes() == [lost]
    assert store.nodes()[0].updated_at.utcoffset() == timedelta(hours=2)


def test_putting_nodes_upserts_by_name_and_keeps_the_others(store: JobStore) -> None:
    store.put_nodes([node("n0", 0), node("n1", 1), node("n2", None, "spare")])
    isolated = node("n1", None, "isolated", agent_pid=None, reason="implicated 3 times",
                    updated_at=T0 + timedelta(seconds=5), times_implicated=3, host="other")
    promoted = node("n2", 1, agent_pid=9999)
    store.put_nodes([isolated, promoted])
    assert store.nodes() == [node("n0", 0), promoted, isolated]


def test_nodes_come_by_slot_then_name_with_slotless_nodes_last(store: JobStore) -> None:
    rows = [node("zeta", None, "spare"), node("b", 1), node("alpha", None, "lost"),
            node("c", 0), node("a", 2), node("beta", None, "isolated")]
    store.put_nodes(rows)
    assert [(n.name, n.slot) for n in store.nodes()] == [
        ("c", 0), ("b", 1), ("a", 2), ("alpha", None), ("beta", None), ("zeta", None)]


def test_nodes_are_put_in_one_transaction(store: JobStore) -> None:
    store.put_nodes([node("n0", 0)])
    broken = node("n2", 2, host=None)  # NOT NULL fails on the second row
    with pytest.raises(StoreError, match="cannot write nodes to the job store"):
        store.put_nodes([node("n1", 1), broken])
    assert store.nodes() == [node("n0", 0)]
    store.put_nodes([])
    assert store.nodes() == [node("n0", 0)]


@pytest.mark.parametrize(("rows", "match"), [
    ([node("n0", 0, "dead")], "state 'dead', not one of healthy, spare, lost, isolated"),
    ([node("n0", 0, backend="k8s")], "backend 'k8s', not one of local, slurm"),
    ([node("n0", 0), node("n0", None, "spare")], r"nodes \['n0'\] are given more than once"),
])
def test_bad_node_rows_are_refused_before_anything_is_written(
    store: JobStore, rows: list[NodeRow], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        store.put_nodes(rows)
    assert store.nodes() == []


def test_a_reader_reads_nodes_but_cannot_write_them(store: JobStore) -> None:
    store.put_nodes([node("n0", 0)])
    with JobStore.open(store.job_dir) as reader:
        assert reader.nodes() == [node("n0", 0)]
        with pytest.raises(StoreError, match="read-only"):
            reader.put_nodes([node("n1", 1)])


@pytest.mark.parametrize("version", [4, 3, 2, 1])
def test_an_old_store_is_migrated_and_keeps_its_rows(tmp_path: Path, version: int) -> None:
    path = make_old_store(tmp_path, version)
    with JobStore.create(tmp_path, "run-1") as s:
        assert user_version(path) == SCHEMA_VERSION
        assert s.meta() == {"run_id": "run-1", "state": "succeeded"}
        assert [e.reason for _, e in s.events()] == ["JobCreated"]
        assert s.workers() == [WorkerRow(0, 0, 0, "node0", 4100, "succeeded", started_at=T0)]
        assert s.nodes() == []
        s.put_nodes([node("n0", 0), node("n1", None, "spare")])
        ev = Event(T0, Level.INFO, "NodeLost", "lost.", Involved("run-1", "n1"), data={"a": 1})
        s.add_event(ev)
    with JobStore.open(tmp_path) as reader:
        assert [n.name for n in reader.nodes()] == ["n0", "n1"]
        assert reader.events()[-1][1] == ev


def test_a_reader_of_a_version_2_store_sees_no_nodes_and_changes_nothing(
    tmp_path: Path,
) -> None:
    path = make_old_store(tmp_path, 2)
    with JobStore.open(tmp_path) as reader:
        assert reader.nodes() == []
        assert [w.node for w in reader.workers()] == ["node0"]
        assert [e.reason for _, e in reader.events()] == ["JobCreated"]
    assert user_version(path) == 2
    raw = sqlite3.connect(path)
    tables = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    raw.close()
    assert "nodes" not in tables


def test_replace_drops_the_rows_of_nodes_the_job_no_longer_has(store: JobStore) -> None:
    store.put_nodes([node("n1", 0), node("n2", 1)])
    store.put_nodes([node("m1", 0), node("m2", 1)], replace=True)
    assert [n.name for n in store.nodes()] == ["m1", "m2"]


def test_a_version_4_store_reads_no_step_time_and_keeps_one_once_migrated(
    tmp_path: Path,
) -> None:
    path = make_old_store(tmp_path, 4)
    with JobStore.open(tmp_path) as reader:  # a reader migrates nothing: the column is NULL
        assert [w.second_last_step_at for w in reader.workers()] == [None]
    assert user_version(path) == 4
    stepped = WorkerRow(1, 0, 0, "node0", 4200, "failed", exit_code=-9, started_at=T0,
                        second_last_step_at=T0 + timedelta(seconds=7, microseconds=5))
    with JobStore.create(tmp_path, "run-1") as s:
        s.put_workers(1, [stepped])
        assert s.workers(1) == [stepped]
        assert s.workers(0)[0].second_last_step_at is None


def test_a_version_6_store_reads_no_stopper_and_keeps_one_once_migrated(
    tmp_path: Path,
) -> None:
    """Schema 7: who stopped a stopped rank (review 53: the verdict told an outside stop from
    the launcher's by times and exit codes)."""
    with JobStore.create(tmp_path, "run-1") as s:
        s.put_workers(0, [WorkerRow(0, 0, 0, "node0", 4100, "stopped", exit_code=143,
                                    started_at=T0)])
    raw = sqlite3.connect(tmp_path / "trainguard.db")
    raw.execute("ALTER TABLE workers DROP COLUMN stopped_by")
    raw.execute("PRAGMA user_version=6")
    raw.commit()
    raw.close()
    reader = JobStore.open(tmp_path)  # a reader migrates nothing: the column is NULL
    assert [w.stopped_by for w in reader.workers()] == [None]
    assert user_version(tmp_path / "trainguard.db") == 6
    outside = WorkerRow(1, 0, 0, "node0", 4200, "stopped", exit_code=0, started_at=T0,
                        stopped_by=StopCause.OUTSIDE)
    with JobStore.create(tmp_path, "run-1") as s:
        s.put_workers(1, [outside])
        assert s.workers(1) == [outside] and s.workers(0)[0].stopped_by is None
    with reader:  # still open (a dashboard, `trainguard watch`): it reads the migrated column
        assert reader.workers(1) == [outside]  # (review 54 #8: NULL until reopened)
        assert reader.events() == [] and reader.nodes() == []
