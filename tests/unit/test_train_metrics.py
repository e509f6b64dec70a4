"""The loss and learning rate a script logs (trainguard.log_metrics, the trainer callbacks)
reach the job's metrics, and a drain verdict reaches only the processes that drain."""

from __future__ import annotations

import math
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from trainguard.cli.status import status_doc
from trainguard.controller.incidents import IncidentBook
from trainguard.controller.store import JobStore
from trainguard.controller.worker_messages import MAX_METRIC_RANKS, WorkerMessages
from trainguard.goodput.metrics import exposition
from trainguard.integrations.drain import Drain
from trainguard.node.channel import ChannelServer
from trainguard.protocol import WorkerMessage
from trainguard.worker import progress
from trainguard.worker.contract import ENV_RANK, ENV_SOCKET, ControlKind, MessageKind

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def handler(tmp_path: Path) -> WorkerMessages:
    store = JobStore.create(tmp_path / "job", "r")
    return WorkerMessages(lambda *a, **k: None, IncidentBook(store))


def metrics_msg(rank: int, **data: Any) -> WorkerMessage:
    return WorkerMessage(kind=MessageKind.TRAIN_METRICS, rank=rank, at=NOW, data=data)


def test_each_rank_keeps_its_latest_values_and_a_metric_not_sent_keeps_its_last(
        tmp_path: Path) -> None:
    h = handler(tmp_path)
    h.handle([metrics_msg(0, step=10, loss=2.5, learning_rate=1e-3),
              metrics_msg(0, step=20, loss=None),  # logged as NaN: null
              metrics_msg(1, step=20, learning_rate=5e-4)], attempt=0)
    assert h.train_metrics[0] == {"step": 20, "loss": None, "learning_rate": 1e-3,
                                  "at": NOW.isoformat()}
    assert h.train_metrics[1]["loss"] is None and h.train_metrics[1]["learning_rate"] == 5e-4
    assert h.train_metrics_changed


def test_only_the_first_ranks_that_report_are_kept(tmp_path: Path) -> None:
    h = handler(tmp_path)
    h.handle([metrics_msg(r, step=1, loss=float(r)) for r in range(MAX_METRIC_RANKS + 5)], 0)
    assert sorted(h.train_metrics) == list(range(MAX_METRIC_RANKS))
    h.handle([metrics_msg(3, step=2, loss=9.0)], 0)  # a kept rank is still updated
    assert h.train_metrics[3]["loss"] == 9.0


def test_metrics_and_status_show_each_reporting_rank(tmp_path: Path) -> None:
    job = tmp_path / "job"
    with JobStore.create(job, "r") as store:
        store.set_meta(training={
            "0": {"step": 14, "loss": 0.6931, "learning_rate": 0.0, "at": NOW.isoformat()},
            "1": {"step": 12, "loss": None, "learning_rate": 2e-4, "at": NOW.isoformat()}})
        meta = store.meta()
    got = {(s.name, s.labels.get("rank")): s.value for f in text_string_to_metric_families(
        exposition(job).decode()) for s in f.samples if s.name.startswith(
            ("trainguard_train", "trainguard_learning"))}
    assert got[("trainguard_train_loss", "0")] == 0.6931
    assert math.isnan(got[("trainguard_train_loss", "1")])  # logged as NaN
    assert got[("trainguard_learning_rate", "1")] == 2e-4
    assert got[("trainguard_train_metrics_step", "0")] == 14
    doc = status_doc(meta, [], str(job))
    assert doc["training"][0] == {"rank": 0, "step": 14, "loss": 0.6931,
                                       "learning_rate": 0.0, "time": NOW.isoformat()}
    assert status_doc({}, [], str(job))["training"] == []


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Any:
    srv = ChannelServer(f"@tg-test-{uuid.uuid4().hex}")
    monkeypatch.setenv(ENV_SOCKET, srv.name)
    monkeypatch.setenv(ENV_RANK, "0")
    monkeypatch.setattr(progress, "_launcher", None)
    yield srv
    srv.close()


def received(srv: ChannelServer, kind: MessageKind) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        got = [m for m in srv.drain() if m["kind"] == kind]
        if got:
            return got
        time.sleep(0.02)
    return []


def test_log_metrics_reaches_the_agent_with_a_nan_loss_as_null(server: ChannelServer) -> None:
    assert progress.log_metrics(7, loss=float("nan"), learning_rate=3e-4)
    (m,) = received(server, MessageKind.TRAIN_METRICS)
    assert (m["step"], m["loss"], m["learning_rate"], m["rank"]) == (7, None, 3e-4, 0)
    assert progress.log_metrics(8, loss=1.25)
    (m,) = received(server, MessageKind.TRAIN_METRICS)
    assert m["loss"] == 1.25 and "learning_rate" not in m


def test_a_drain_reaches_only_a_process_that_drains_and_a_single_rank_drains_at_once(
        server: ChannelServer) -> None:
    verdict = {"kind": ControlKind.DRAIN.value, "reason": "the launcher got SIGTERM"}
    assert server.tell([0], verdict) == 0  # nobody listens: the launcher will not wait
    d = Drain()
    d.start()
    assert not d.step_end()  # nothing asked yet
    assert server.tell([0], {"kind": ControlKind.RESTART.value, "generation": 1,
                             "master_addr": "127.0.0.1", "master_port": 29500}) == 0
    assert server.tell([0], verdict) == 1
    deadline = time.monotonic() + 5
    while not d.step_end() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert d.agreed and d.reason == "the launcher got SIGTERM"
    d.drained_at = 5
    with pytest.raises(SystemExit) as e:
        d.finish()
    assert e.value.code == 143


def test_status_shows_a_logged_value_as_a_logger_would() -> None:
    """Walk-through 24: `loss 2.5786819458007812, learning rate 0.00032950073900936237`."""
    from trainguard.cli.status import _metric

    assert _metric(2.5786819458007812) == "2.57868"
    assert _metric(0.00032950073900936237) == "0.000329501"
    assert _metric(None) == "-" and _metric(0.0) == "0"
