"""Memory snapshots' blocking reaches the goodput (walk-through 34 #3: with `--memory-every 1`
each step got 28% slower and goodput went up, the wait booked productive): rank 0 times each
snapshot, reports the sum and count every few seconds (not a message per step), the
controller keeps the reports in the job store, and the ledger books them as
checkpoint_blocking."""

from __future__ import annotations

import math
import sqlite3
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from trainguard.checkpoint.snapshot_timing import BlockingTally, SnapshotTimer, flush_reports
from trainguard.controller.incidents import IncidentBook
from trainguard.controller.store import JobStore
from trainguard.controller.worker_messages import WorkerMessages
from trainguard.goodput.ledger import Attempt, LedgerInput, account
from trainguard.goodput.metrics import exposition
from trainguard.goodput.read import job_goodput, snapshot_reports
from trainguard.node.channel import ChannelServer
from trainguard.protocol import WorkerMessage
from trainguard.records import RunningRecord, StartType
from trainguard.worker import channel, contract
from trainguard.worker.contract import MessageKind, parse_message
from trainguard.worker.fields import ContractError

T0 = datetime(2026, 12, 6, tzinfo=timezone.utc)
E0 = T0.timestamp()

# -- the rank: a batch every few seconds, and what is left at the end ----------------------


def test_snapshots_are_reported_as_one_sum_and_count_every_few_seconds() -> None:
    tally = BlockingTally(every_s=5.0)
    sent = [b for i in range(30)  # one snapshot of 0.1 s every 0.5 s, for 15 s
            if (b := tally.add(i + 1, 0.1, 1000.0 + i * 0.5, now=i * 0.5)) is not None]
    assert [b["snapshots"] for b in sent] == [11, 10]
    assert [b["step"] for b in sent] == [11, 21]
    assert math.isclose(sent[0]["blocked_s"], 1.1) and sent[0]["ended_at"] == 1005.0
    rest = tally.take()  # at exit
    assert rest is not None and rest["snapshots"] == 9 and rest["step"] == 30
    assert math.isclose(sum(b["blocked_s"] for b in [*sent, rest]), 3.0)
    assert tally.take() is None  # nothing counted since: nothing to send


def test_a_batch_that_could_not_be_sent_goes_with_the_next_one() -> None:
    tally = BlockingTally(every_s=5.0)
    tally.add(1, 0.2, 100.0, now=0.0)
    first = tally.take()
    assert first is not None
    tally.put_back(first)  # the agent's queue was full
    tally.add(2, 0.3, 101.0, now=1.0)
    both = tally.take()
    assert both is not None and (both["snapshots"], both["step"], both["ended_at"]) == (
        2, 2, 101.0)
    assert math.isclose(both["blocked_s"], 0.5)


@pytest.fixture
def agent(monkeypatch: pytest.MonkeyPatch) -> Any:
    server = ChannelServer(f"@tg-test-{uuid.uuid4().hex[:8]}")
    monkeypatch.setenv(channel.ENV_SOCKET, server.name)
    yield server
    server.close()


def test_rank_0_times_each_snapshot_and_its_close_sends_the_rest(
        agent: ChannelServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(contract.ENV_RANK, "0")
    timer = SnapshotTimer(rank=0)
    for step in (1, 2, 3):
        with timer.timed(step):
            pass  # a snapshot: far under the 5 s between reports
    assert agent.drain() == []  # no message per step
    timer.close()  # the Checkpointer closed (or an in-process restart abandoned it)
    (got,) = agent.drain()
    assert got["kind"] == MessageKind.SNAPSHOT_BLOCKING and got["rank"] == 0
    assert got["snapshots"] == 3 and got["step"] == 3 and 0 <= got["blocked_s"] < 0.5
    timer.close()
    assert agent.drain() == []  # sent once


def test_a_rank_that_ends_without_atexit_sends_its_report_first(
        agent: ChannelServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stop after a save on the way out ends with os._exit: it flushes the reports."""
    monkeypatch.setenv(contract.ENV_RANK, "0")
    timer = SnapshotTimer(rank=0)
    with timer.timed(7):
        pass
    flush_reports()
    (got,) = agent.drain()
    assert (got["snapshots"], got["step"]) == (1, 7)
    timer.close()
    assert agent.drain() == []


def test_other_ranks_send_nothing_rank_0_s_figure_is_the_job_s(agent: ChannelServer) -> None:
    timer = SnapshotTimer(rank=1)
    with timer.timed(1):
        pass
    timer.close()
    assert agent.drain() == []


def test_the_report_is_checked_like_every_message() -> None:
    ok = {"kind": "snapshot_blocking", "blocked_s": 0.5, "snapshots": 5, "step": 10,
          "ended_at": E0}
    assert parse_message(ok)["snapshots"] == 5
    for bad in ({"snapshots": 0}, {"blocked_s": -1.0}, {"blocked_s": float("inf")},
                {"blocked_s": None}, {"snapshots": 1.5}):
        with pytest.raises(ContractError):
            parse_message({**ok, **bad})


# -- the controller: a row for the store, no event -----------------------------------------


def test_the_controller_keeps_the_report_for_the_store_and_makes_no_event(
        tmp_path: Path) -> None:
    events: list[Any] = []
    store = JobStore.create(tmp_path / "job", "r")
    h = WorkerMessages(lambda *a, **k: events.append(a), IncidentBook(store))
    h.handle([WorkerMessage(kind=MessageKind.SNAPSHOT_BLOCKING, rank=0, at=T0,
                            data={"blocked_s": 0.5, "snapshots": 5, "step": 10,
                                  "ended_at": E0 - 1})], attempt=2)
    assert h.snapshot_blocking == [(2, 0, E0 - 1, 0.5, 5)] and events == []
    store.add_snapshot_blocking(h.snapshot_blocking)
    store.add_snapshot_blocking([(2, 1, E0, 9.0, 5)])  # another rank's: not the job's
    assert store.snapshot_blocking(rank=0) == [(2, E0 - 1, 0.5, 5)]
    store.close()


def test_a_store_of_schema_5_reads_no_snapshot_blocking_and_gets_the_table_once_migrated(
        tmp_path: Path) -> None:
    JobStore.create(tmp_path / "job", "r").close()
    raw = sqlite3.connect(tmp_path / "job" / "trainguard.db")
    raw.execute("DROP TABLE snapshot_blocking")
    raw.execute("ALTER TABLE workers DROP COLUMN stopped_by")  # (schema 7's)
    raw.execute("PRAGMA user_version=5")
    raw.commit()
    raw.close()
    with JobStore.open(tmp_path / "job") as old:
        assert old.snapshot_blocking() == []
    with JobStore.create(tmp_path / "job", "r") as s:
        s.add_snapshot_blocking([(0, 0, E0, 0.25, 1)])
        assert s.snapshot_blocking() == [(0, E0, 0.25, 1)]


# -- the ledger, the metrics -----------------------------------------------------------


def test_a_report_is_booked_as_checkpoint_blocking_out_of_productive_time() -> None:
    inp = LedgerInput(start=0.0, end=21.0, attempts=[Attempt(0, 0.0, 21.0, launch=True)],
                      samples=[(0, s, float(s)) for s in range(1, 21)],
                      saves=[(10.0, 0.25)], snapshots=[(5.0, 1.5), (15.0, 2.0)])
    g = account(inp)
    assert math.isclose(g.seconds("checkpoint_blocking"), 0.25 + 1.5 + 2.0)
    assert math.isclose(g.productive_s, 19.0 - 3.75)
    blocking = [(s.start, s.end) for s in g.segments if s.cause == "checkpoint_blocking"]
    assert blocking == [(3.5, 5.0), (9.75, 10.0), (13.0, 15.0)]  # each ends at its report


def test_a_job_with_snapshots_shows_them_in_goodput_and_the_blocking_histogram(
        tmp_path: Path) -> None:
    job = tmp_path / "job"
    with JobStore.create(job, "r") as s:
        s.set_meta(state="succeeded", created_at=T0.isoformat(),
                   ended_at=datetime.fromtimestamp(E0 + 21, timezone.utc).isoformat())
        rec = RunningRecord(0, T0, StartType.FIRST_START)
        rec.end_at = datetime.fromtimestamp(E0 + 21, timezone.utc)
        s.put_running(rec)
        s.add_progress([(0, n, E0 + n) for n in range(1, 21)])
        s.add_snapshot_blocking([(0, 0, E0 + 10, 1.0, 10), (0, 0, E0 + 20, 0.5, 10)])
    with JobStore.open(job) as r:
        assert [x.snapshots for x in snapshot_reports(r)] == [10, 10]
        g = job_goodput(r)
    assert math.isclose(g.seconds("checkpoint_blocking"), 1.5)
    hist = {(x.name, x.labels.get("le")): x.value
            for f in text_string_to_metric_families(exposition(job).decode()) for x in f.samples
            if x.name.startswith("trainguard_checkpoint_blocking_seconds")}
    assert hist[("trainguard_checkpoint_blocking_seconds_count", None)] == 20
    assert math.isclose(hist[("trainguard_checkpoint_blocking_seconds_sum", None)], 1.5)
    assert hist[("trainguard_checkpoint_blocking_seconds_bucket", "0.05")] == 10  # 0.05 each
    assert hist[("trainguard_checkpoint_blocking_seconds_bucket", "0.1")] == 20  # 0.1 each


def test_a_report_of_no_snapshots_observes_nothing(tmp_path: Path) -> None:
    """Review 35 #3: a row of 0 snapshots (a damaged store) made `trainguard metrics` a
    ZeroDivisionError traceback."""
    job = tmp_path / "job"
    with JobStore.create(job, "r") as s:
        s.set_meta(state="succeeded", created_at=T0.isoformat())
        s.add_snapshot_blocking([(0, 0, E0 + 10, 1.0, 0), (0, 0, E0 + 20, 0.5, 10)])
    hist = {x.name: x.value
            for f in text_string_to_metric_families(exposition(job).decode()) for x in f.samples
            if x.name == "trainguard_checkpoint_blocking_seconds_count"}
    assert hist == {"trainguard_checkpoint_blocking_seconds_count": 10}
