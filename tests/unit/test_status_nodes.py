"""`trainguard status` of a multi-node job: the nodes array and the nodes table."""

from __future__ import annotations

import argparse
import json
import os
import socket
import sqlite3
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from trainguard.backends import orphans
from trainguard.backends.orphans import AgentsSeen
from trainguard.cli.fmt import clock
from trainguard.cli.read import add_read_commands
from trainguard.cli.status import status_doc
from trainguard.controller.store import JobStore, NodeRow, WorkerRow
from trainguard.records import iso
from trainguard.ui.jobs import live_parts

T0 = datetime(2025, 3, 1, 12, 0, 0, 250000, tzinfo=timezone.utc)
NODE_KEYS = {"name", "host", "state", "agent_pid", "slot", "reason", "updated_at", "backend",
             "times_implicated"}
NODES = [
    NodeRow("n2", "host-c", "spare", 5102, None, None, T0, "slurm"),
    NodeRow("n1", "host-b", "lost", None, None, "agent silent for 30s", T0 + timedelta(seconds=3),
            "slurm", times_implicated=1),
    NodeRow("n3", "host-d", "healthy", 5103, 1, None, T0, "slurm"),
    NodeRow("n0", "host-a", "healthy", 5100, 0, None, T0, "slurm"),
]


def workers() -> list[WorkerRow]:
    return [WorkerRow(2, rank, 0, node, 6000 + rank, "running", started_at=T0, start_count=2)
            for rank, node in ((1, "n3"), (0, "n0"))]


@pytest.fixture
def job(tmp_path: Path) -> Path:
    """A running two-slot job: n0 and n3 in the placement, n2 spare, n1 lost."""
    job_dir = tmp_path / "job"
    with JobStore.create(job_dir, "run-1") as s:
        s.put_workers(2, workers())
        s.put_nodes(NODES)
        s.set_meta(state="restarting", attempt=2, restarts_used=1, max_restarts=3)
    return job_dir


def run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="trainguard")
    add_read_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


def status_json(job: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    assert run("status", str(job), "--json") == 0
    doc: dict[str, object] = json.loads(capsys.readouterr().out)
    return doc


def test_status_json_has_one_object_per_node_by_slot_then_name(
    job: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = status_json(job, capsys)
    nodes = doc["nodes"]
    assert isinstance(nodes, list)
    assert all(set(n) == NODE_KEYS for n in nodes)
    assert [(n["name"], n["slot"]) for n in nodes] == [
        ("n0", 0), ("n3", 1), ("n1", None), ("n2", None)]
    assert nodes[2] == {
        "name": "n1",
        "host": "host-b",
        "state": "lost",
        "agent_pid": None,
        "slot": None,
        "reason": "agent silent for 30s",
        "updated_at": iso(T0 + timedelta(seconds=3)),
        "backend": "slurm",
        "times_implicated": 1,
    }
    assert datetime.fromisoformat(nodes[2]["updated_at"]) == T0 + timedelta(seconds=3)
    assert (nodes[0]["agent_pid"], nodes[0]["times_implicated"]) == (5100, 0)


def test_status_json_ranks_still_name_their_node(
    job: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = status_json(job, capsys)
    assert [(r["rank"], r["node"]) for r in doc["ranks"]] == [(0, "n0"), (1, "n3")]  # type: ignore[attr-defined]


def test_status_json_of_a_job_without_node_rows_has_an_empty_nodes_array(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with JobStore.create(tmp_path, "run-1") as s:
        s.put_workers(2, workers()[:1])
    assert status_json(tmp_path, capsys)["nodes"] == []


def test_status_of_a_version_2_store_reads_with_no_nodes(
    job: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = sqlite3.connect(job / "trainguard.db")
    raw.execute("DROP TABLE nodes")
    raw.execute("PRAGMA user_version=2")
    raw.commit()
    raw.close()
    doc = status_json(job, capsys)
    assert doc["nodes"] == [] and len(doc["ranks"]) == 2  # type: ignore[arg-type]
    assert run("status", str(job)) == 0
    assert "HOST" not in capsys.readouterr().out


def test_status_text_shows_a_nodes_table_with_states_reasons_and_update_times(
    job: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("status", str(job)) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("NAME"))
    for column in ("HOST", "STATE", "AGENT PID", "SLOT", "BACKEND", "TIMES IMPLICATED",
                   "UPDATED AT", "REASON"):
        assert column in lines[header]
    rows = lines[header + 1: header + 5]
    assert [r.split()[0] for r in rows] == ["n0", "n3", "n1", "n2"]
    assert rows[2].split()[:6] == ["n1", "host-b", "lost", "-", "-", "slurm"]
    assert "agent silent for 30s" in rows[2]
    assert clock(T0 + timedelta(seconds=3)) in rows[2]
    assert any(line.startswith("RANK") for line in lines[header + 5:])


def test_status_text_of_a_single_node_job_has_no_nodes_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with JobStore.create(tmp_path, "run-1") as s:
        s.put_workers(2, workers()[:1])
    assert run("status", str(tmp_path)) == 0
    out = capsys.readouterr().out
    assert "HOST" not in out and "AGENT PID" not in out
    assert "RANK" in out


def test_status_doc_keeps_its_three_argument_form_and_orders_the_nodes_it_gets() -> None:
    assert status_doc({}, [], "/jobs/a")["nodes"] == []
    doc = status_doc({}, [], "/jobs/a", NODES)
    assert [n["name"] for n in doc["nodes"]] == ["n0", "n3", "n1", "n2"]


def test_status_says_how_many_connections_the_controller_refused() -> None:
    assert status_doc({}, [], "/jobs/a")["connections_refused"] == {}
    doc = status_doc({"connections_refused": {"handshake": 2, "over_budget": 0,
                                              "forged_frame": 1}}, [], "/jobs/a")
    assert doc["connections_refused"] == {"handshake": 2, "over_budget": 0, "forged_frame": 1}


def test_status_says_how_many_worker_messages_the_agents_refused() -> None:
    """(security.md W3's leftover) The worker channels' refusals were in the agents' logs only."""
    assert status_doc({}, [], "/jobs/a")["worker_messages_refused"] == 0
    assert status_doc({"worker_messages_refused": 4}, [], "/jobs/a")[
        "worker_messages_refused"] == 4
    assert status_doc({"worker_messages_refused": "x", "connections_refused": [1]}, [],
                      "/jobs/a") | {} == status_doc({}, [], "/jobs/a")  # a garbled meta: none


def test_a_lost_job_s_nodes_and_ranks_keep_their_states_when_slurm_cannot_say() -> None:
    """Review 53 #6: a failing squeue read as every agent gone: every node and rank `lost`."""
    lost = {"state": "running", "launcher_pid": 2 ** 22 + 12345,  # (no such pid here)
            "launcher_host": socket.gethostname()}
    why = "Slurm could not be asked whether they run (squeue: Socket timed out)"
    doc = status_doc(lost, workers(), "/jobs/a", NODES, agents=AgentsSeen([], why))
    assert doc["state"] == "lost" and doc["agents_unknown"] == why
    assert {n["name"]: n["state"] for n in doc["nodes"]} == {  # type: ignore[index]
        "n0": "healthy", "n1": "lost", "n2": "spare", "n3": "healthy"}
    assert {r["state"] for r in doc["ranks"]} == {"running"}  # type: ignore[index]
    gone = status_doc(lost, workers(), "/jobs/a", NODES, agents=AgentsSeen())  # Slurm said none
    assert {n["state"] for n in gone["nodes"]} == {"lost"}  # type: ignore[index]


def test_the_dashboard_says_what_status_says_when_slurm_cannot_be_asked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Review 54 #7: the dashboard kept the recorded states when squeue failed but never said
    why; `status --json` did. Both read orphans.agents_seen now (one place decides which
    nodes keep their states), with a failing squeue on PATH (the I/O layer's fake)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text("#!/bin/sh\necho 'slurm_load_jobs error: Socket timed out "
                                    "on send/recv operation' >&2\nexit 1\n")
    (bin_dir / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(orphans, "_steps_seen", {})
    job = tmp_path / "lost-job"
    with JobStore.create(job, "run-1") as s:  # its launcher gone (no such pid here): lost
        s.put_workers(2, workers())
        s.put_nodes(NODES)
        s.set_meta(state="running", slurm_job_id="6", launcher_pid=2 ** 22 + 12345,
                   launcher_host=socket.gethostname())
    doc = status_json(job, capsys)
    with JobStore.open(job) as s:
        live = live_parts(s, s.meta(), s.running_records())
    assert live["state"] == doc["state"] == "lost"
    assert live["agents_unknown"] == doc["agents_unknown"]
    assert "Socket timed out" in str(live["agents_unknown"])
    assert live["agents_without_controller"] == doc["agents_without_controller"] == []
    assert {n["name"]: n["state"] for n in live["nodes"]} == {  # their recorded states
        n["name"]: n["state"] for n in doc["nodes"]} == {  # type: ignore[attr-defined]
        "n0": "healthy", "n1": "lost", "n2": "spare", "n3": "healthy"}
    assert {r["state"] for r in live["workers"]} == {"running"}
