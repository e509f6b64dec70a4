"""The job store: round trips, reuse rules, clear errors and WAL concurrency (real SQLite)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

import trainguard.controller.store
from trainguard.controller.store import SCHEMA_VERSION, JobStore, WorkerRow
from trainguard.errors import StoreError, TrainguardError
from trainguard.records import (
    Event,
    FaultScenario,
    Involved,
    Level,
    RecoverRecord,
    RecoverResult,
    RunningRecord,
    StartType,
)

T0 = datetime(2025, 3, 1, 12, 0, 0, 123456, tzinfo=timezone.utc)
SRC_DIR = Path(trainguard.controller.store.__file__).resolve().parents[1]


def event(
    reason: str, seconds: float = 0, rank: int | None = None, attempt: int | None = None
) -> Event:
    return Event(
        time=T0 + timedelta(seconds=seconds),
        level=Level.INFO,
        reason=reason,
        message=f"{reason} happened.",
        involved=Involved(job="run-1", node="node0", rank=rank, attempt=attempt),
    )


def recover_record() -> RecoverRecord:
    return RecoverRecord(
        attempt=0,
        recover_start_at=T0 + timedelta(seconds=10.000001),
        fault_scenario=FaultScenario.JOB_FAILED,
        reason="rank 1 exited with code 1",
        related_task="rank 1",
        recover_result=RecoverResult.SUCCESS,
        recover_end_at=T0 + timedelta(seconds=25),
        fault_at=T0 + timedelta(seconds=9.5),
        detected_at=T0 + timedelta(seconds=10),
        decided_at=T0 + timedelta(seconds=10.2),
        workers_stopped_at=T0 + timedelta(seconds=12),
        workers_started_at=T0 + timedelta(seconds=14),
        first_progress_at=T0 + timedelta(seconds=25),
        last_step_before=120,
        resumed_step=100,
        steps_lost=20,
        category="user_code",
    )


@pytest.fixture
def store(tmp_path: Path) -> Iterator[JobStore]:
    with JobStore.create(tmp_path / "job", "run-1") as s:
        yield s


def test_a_new_store_lives_in_the_job_dir_and_records_the_run_id(tmp_path: Path) -> None:
    with JobStore.create(tmp_path / "a" / "job", "run-1") as s:
        assert s.path == tmp_path / "a" / "job" / "trainguard.db"
        assert s.meta() == {"run_id": "run-1"}
        assert s._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"  # while it runs
    raw = sqlite3.connect(tmp_path / "a" / "job" / "trainguard.db")
    assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "delete"  # once it ended
    raw.close()


def test_meta_values_round_trip_as_json_and_later_values_win(store: JobStore) -> None:
    store.set_meta(state="running", attempt=0, command=["python", "train.py"], exit_code=None)
    store.set_meta(attempt=1, last_progress_at=1.5)
    assert store.meta() == {
        "run_id": "run-1",
        "state": "running",
        "attempt": 1,
        "command": ["python", "train.py"],
        "exit_code": None,
        "last_progress_at": 1.5,
    }


def test_events_come_back_in_order_with_growing_ids(store: JobStore) -> None:
    evs = [event("JobCreated"), event("WorkerFailed", 1, rank=1, attempt=0)]
    ids = [store.add_event(e) for e in evs]
    assert ids == [1, 2]
    assert store.events() == list(zip(ids, evs, strict=True))
    assert store.events(after_id=1) == [(2, evs[1])]
    assert store.events(after_id=2) == []


def test_running_records_round_trip_exactly_with_their_recover_records(store: JobStore) -> None:
    cest = timezone(timedelta(hours=2))
    first = RunningRecord(
        attempt=0,
        start_at=T0.astimezone(cest),
        start_type=StartType.FIRST_START,
        end_at=T0 + timedelta(seconds=9.5),
        end_reason="WorkerFailed",
        end_related_task="rank 1",
        end_recover="process_restart",
        master_port=29500,
        first_step=0,
        last_step=120,
        recover_records=[recover_record()],
    )
    second = RunningRecord(attempt=1, start_at=T0, start_type=StartType.AUTO_RESTART)
    store.put_running(second)
    store.put_running(first)
    assert store.running_records() == [first, second]


def test_putting_a_running_record_again_replaces_that_attempt(store: JobStore) -> None:
    rec = RunningRecord(attempt=0, start_at=T0, start_type=StartType.FIRST_START)
    store.put_running(rec)
    rec.recover_records.append(recover_record())
    rec.end_reason = "WorkerFailed"
    store.put_running(rec)
    assert store.running_records() == [rec]


def test_records_from_dict_inverts_to_dict() -> None:
    rec = RunningRecord(
        attempt=0,
        start_at=T0.replace(microsecond=123000),
        start_type=StartType.FIRST_START,
        recover_records=[recover_record()],
    )
    back = RunningRecord.from_dict(json.loads(json.dumps(rec.to_dict())))
    assert back.to_dict() == rec.to_dict()
    ev = event("NoProgress", rank=3)
    assert Event.from_dict(ev.to_dict()).to_dict() == ev.to_dict()


def worker(attempt: int, rank: int, state: str = "running") -> WorkerRow:
    return WorkerRow(
        attempt=attempt,
        rank=rank,
        local_rank=rank,
        node="node0",
        pid=1000 + rank,
        state=state,
        started_at=T0,
        start_count=attempt + 1,
    )


def test_worker_rows_replace_their_attempt_and_default_to_the_latest(store: JobStore) -> None:
    assert store.workers() == []
    store.put_workers(0, [worker(0, 1), worker(0, 0)])
    failed = WorkerRow(0, 1, 1, "node0", 1001, "failed", None, "SIGKILL", T0, T0, 1)
    store.put_workers(0, [worker(0, 0, state="stopped"), failed])
    store.put_workers(1, [worker(1, 0), worker(1, 1)])
    assert store.workers(0) == [worker(0, 0, state="stopped"), failed]
    assert store.workers() == [worker(1, 0), worker(1, 1)]


def test_worker_rows_of_another_attempt_are_refused(store: JobStore) -> None:
    with pytest.raises(ValueError, match="another attempt"):
        store.put_workers(1, [worker(0, 0)])


def test_creating_a_store_again_with_the_same_run_id_reuses_it(tmp_path: Path) -> None:
    with JobStore.create(tmp_path, "run-1") as s:
        s.add_event(event("JobCreated"))
    with JobStore.create(tmp_path, "run-1") as s:
        assert [e.reason for _, e in s.events()] == ["JobCreated"]


def test_creating_a_store_with_another_run_id_names_the_dir_and_the_fix(tmp_path: Path) -> None:
    JobStore.create(tmp_path, "run-1").close()
    with pytest.raises(StoreError) as info:
        JobStore.create(tmp_path, "run-2")
    assert str(tmp_path) in str(info.value)
    assert ("drop --run-id (or pass --run-id run-1) to continue that job, or use another "
            "--job-dir") in str(info.value)
    assert isinstance(info.value, TrainguardError)


def test_opening_a_dir_without_a_store_says_where_it_looked(tmp_path: Path) -> None:
    with pytest.raises(StoreError) as info:
        JobStore.open(tmp_path / "nope")
    msg = str(info.value)
    assert msg.startswith(f"no trainguard job at {tmp_path / 'nope'} (expected ")
    assert "trainguard.db" in msg and "pass the job dir printed by `trainguard run`" in msg
    assert not (tmp_path / "nope").exists()


def test_a_reader_accepts_the_db_file_itself(store: JobStore) -> None:
    store.add_event(event("JobCreated"))
    with JobStore.open(store.path) as reader:
        assert len(reader.events()) == 1
        assert reader.job_dir == store.job_dir


def test_a_reader_cannot_write(store: JobStore) -> None:
    with JobStore.open(store.job_dir) as reader, pytest.raises(StoreError, match="read-only"):
        reader.set_meta(state="failed")


def test_a_reader_still_reads_after_the_writer_closed(tmp_path: Path) -> None:
    with JobStore.create(tmp_path, "run-1") as s:
        s.add_event(event("JobSucceeded"))
        s.set_meta(state="succeeded")
    with JobStore.open(tmp_path) as reader:
        assert reader.meta()["state"] == "succeeded"
        assert [e.reason for _, e in reader.events()] == ["JobSucceeded"]


def test_a_store_of_a_newer_schema_version_is_refused_clearly(tmp_path: Path) -> None:
    JobStore.create(tmp_path, "run-1").close()
    raw = sqlite3.connect(tmp_path / "trainguard.db")
    raw.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    raw.commit()
    raw.close()
    with pytest.raises(StoreError, match="newer trainguard"):
        JobStore.open(tmp_path)
    with pytest.raises(StoreError, match="newer trainguard"):
        JobStore.create(tmp_path, "run-1")


def test_a_file_that_is_not_a_database_gives_a_store_error(tmp_path: Path) -> None:
    (tmp_path / "trainguard.db").write_bytes(b"this is not sqlite at all, " * 100)
    with pytest.raises(StoreError, match=r"trainguard\.db"):
        JobStore.open(tmp_path)
    with pytest.raises(StoreError, match=r"trainguard\.db"):
        JobStore.create(tmp_path, "run-1")


READER = """
import json, sys, time
from pathlib import Path
from trainguard.controller.store import JobStore
n = int(sys.argv[2])
store = JobStore.open(Path(sys.argv[1]))
print("ready", flush=True)
ids, partial_reads, deadline = [], 0, time.monotonic() + 30
while len(ids) < n and time.monotonic() < deadline:
    ids += [i for i, _ in store.events(ids[-1] if ids else 0)]
    partial_reads += 0 < len(ids) < n
print(json.dumps({"ids": ids, "partial_reads": partial_reads}))
"""


def test_a_reader_in_another_process_reads_events_while_the_writer_appends(
    store: JobStore,
) -> None:
    n = 200
    path = os.pathsep.join([str(SRC_DIR), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    proc = subprocess.Popen(
        [sys.executable, "-c", READER, str(store.job_dir), str(n)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    slowest = 0.0
    for i in range(n):
        started = time.monotonic()
        store.add_event(event("WorkerFailed", i, rank=i % 4))
        slowest = max(slowest, time.monotonic() - started)
        time.sleep(0.002)
    out, _ = proc.communicate(timeout=60)
    result = json.loads(out)
    assert proc.returncode == 0
    assert result["ids"] == list(range(1, n + 1))
    assert result["partial_reads"] > 0, "the reader never saw the store mid-write"
    assert slowest < 1.0, f"a write took {slowest:.3f}s with a reader polling"


def test_a_copy_of_the_db_file_alone_holds_every_event_once_the_writer_closed(
        tmp_path: Path) -> None:
    import shutil

    from trainguard.records import Event, Involved, Level, utcnow

    """A reader (a dashboard, `events -f`) still has the store open when the job ends: the
    writer's close folds the WAL in anyway."""
    with JobStore.create(tmp_path / "a", "run-1") as s:
        reader = JobStore.open(tmp_path / "a")
        for i in range(50):
            s.add_event(Event(utcnow(), Level.INFO, "JobRunning", f"event {i}",
                              Involved("run-1")))
    (tmp_path / "b").mkdir()
    shutil.copy(tmp_path / "a" / "trainguard.db", tmp_path / "b" / "trainguard.db")
    with JobStore.open(tmp_path / "b") as copy:
        assert len(copy.events()) == 50
    reader.close()


def test_a_reader_that_cannot_write_the_dir_sees_a_live_writers_latest_meta(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Audit D11: `immutable=1` ignores the write-ahead log, so a reader without write
    access to the job dir saw stale meta while the job ran."""
    writer = JobStore.create(tmp_path / "job", "r")
    try:
        writer.set_meta(x=1)
        writer.set_meta(y=2)
        monkeypatch.setattr("trainguard.controller.store_file.os.access", lambda p, mode: False)
        reader = JobStore.open(tmp_path / "job")
        try:
            assert reader.meta().get("y") == 2
        finally:
            reader.close()
    finally:
        writer.close()


def test_reading_an_ended_job_leaves_no_wal_or_shm_file_beside_its_store(tmp_path: Path) -> None:
    """The writer leaves WAL mode when it closes: `status` and the other read commands of
    an ended job open it without making trainguard.db-wal and -shm (they did, 32 KiB)."""
    job = tmp_path / "job"
    with JobStore.create(job, "run-1") as s:
        s.add_event(event("JobCreated"))
    for _ in range(2):
        with JobStore.open(job) as r:
            assert [e.reason for _, e in r.events()] == ["JobCreated"]
    assert sorted(p.name for p in job.iterdir() if p.name.startswith("trainguard.db")) == [
        "trainguard.db"]
    with JobStore.create(job, "run-1") as s:  # a relaunch writes in WAL mode again
        assert s._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        s.add_event(event("JobRelaunched"))
    with JobStore.open(job) as r:
        assert [e.reason for _, e in r.events()] == ["JobCreated", "JobRelaunched"]


def test_a_damaged_store_is_told_with_the_fix_for_reading_and_for_launching(
        tmp_path: Path) -> None:
    """Walk-through 21: every command said only `file is not a database`."""
    job = tmp_path / "job"
    job.mkdir()
    (job / "trainguard.db").write_bytes(b"garbage, not sqlite" * 100)
    for opening in (lambda: JobStore.open(job), lambda: JobStore.create(job, "r")):
        with pytest.raises(StoreError) as err:
            opening()
        msg = str(err.value)
        assert "file is not a database. Fix: the store is damaged; move it and its" in msg, msg
        assert "-wal and -shm files aside" in msg and "trainguard diagnose LOG_DIR" in msg


def test_an_empty_store_left_by_a_launch_that_died_says_so_not_try_again(
        tmp_path: Path) -> None:
    """Walk-through 35 F5: a 0-byte trainguard.db two days old was "still being created; try
    again" for ever. Fresh, it still is: a launcher makes the file, then its schema."""
    job = tmp_path / "job"
    job.mkdir()
    (job / "trainguard.db").write_bytes(b"")
    with pytest.raises(StoreError, match="is empty: the job is still being created; try again"):
        JobStore.open(job)
    os.utime(job / "trainguard.db", (time.time() - 2 * 86400,) * 2)
    with pytest.raises(StoreError) as e:
        JobStore.open(job)
    assert "is empty and has not changed since " in str(e.value)
    assert f"a launch that died before writing it (killed, or the disk full). Fix: run the " \
        f"`trainguard run` command again with --job-dir {job}" in str(e.value)
    JobStore.create(job, "tg-again").close()  # as the fix says: the store is made anew
    with JobStore.open(job) as store:
        assert store.meta()["run_id"] == "tg-again"


def test_the_newest_event_of_a_reason_is_read_through_an_index(tmp_path: Path) -> None:
    """Review 45 #7: the dashboard reads a job's last checkpoint and stop under way for each
    row every few seconds; without an index each read scanned every event. A store made by
    an older trainguard gets it from the next writer that opens it."""
    with JobStore.create(tmp_path / "job", "r") as s:
        s.add_event(Event(datetime.now(timezone.utc), Level.INFO, "CheckpointSaved", "m",
                          Involved("r")))
        ran: list[str] = []  # the store's own queries, as SQLite ran them
        s._conn.set_trace_callback(ran.append)
        s.last_checkpoint(), s.last_checkpoint_location(), s.events(reasons=("JobCreated",))
        s._conn.set_trace_callback(None)
        selects = [q for q in ran if q.lstrip().upper().startswith("SELECT")]
        assert len(selects) == 3, ran
        for query in selects:
            plan = " ".join(str(r) for r in s._conn.execute(f"EXPLAIN QUERY PLAN {query}"))
            assert "INDEX events_by_reason" in plan, (query, plan)
    db = tmp_path / "job" / "trainguard.db"
    with sqlite3.connect(db) as conn:
        conn.execute("DROP INDEX events_by_reason")  # as an older trainguard made it
    JobStore.create(tmp_path / "job", "r").close()
    with sqlite3.connect(db) as conn:
        names = [r[1] for r in conn.execute("PRAGMA index_list(events)")]
    assert "events_by_reason" in names, names
