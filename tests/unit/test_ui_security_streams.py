"""Walk-through 32 #6 and #10, against the real `trainguard ui` process: event streams that
clients open and drop give their store connections back (the process's fds return to their
baseline), and an event id past SQLite's integer range is a 400 naming the range, not a 500
with a traceback in the server's log."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.unit.test_ui_api import api_client, make_job
from tests.unit.ui_process import running_ui, stderr_after_stop
from trainguard.ui.catalog import Catalog, job_id

STREAMS = 40
TOO_BIG = str(2**63)  # SQLite's integers end at 2**63 - 1


@pytest.fixture
def ui(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], int, str]]:
    """`trainguard ui` over a running job (the test's pid is its launcher, so it stays
    `running` and its streams stay open): the process, its port, the job's id."""
    job = tmp_path / "live"
    make_job(job, running=True).close()
    with running_ui(job) as (proc, port):
        yield proc, port, job_id(job.resolve())


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _open_stream(port: int, jid: str) -> socket.socket:
    """A stream's connection, once its first `job` message came (its feed is open)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(f"GET /api/jobs/{jid}/stream HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    got = b""
    while b"event: job" not in got:
        chunk = s.recv(65536)
        assert chunk, got
        got += chunk
    return s


def test_streams_dropped_by_their_clients_give_their_store_connections_back(
        ui: tuple[subprocess.Popen[str], int, str]) -> None:
    proc, port, jid = ui
    _open_stream(port, jid).close()  # warm up: threads, imports, the first store open
    time.sleep(1.0)
    baseline = _fds(proc.pid)
    held = [_open_stream(port, jid) for _ in range(STREAMS)]
    assert _fds(proc.pid) >= baseline + STREAMS * 2  # a socket and the store's files each
    for s in held:
        s.close()
    deadline = time.monotonic() + 6.0
    while _fds(proc.pid) > baseline + 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    left = _fds(proc.pid)
    links = sorted(os.readlink(f"/proc/{proc.pid}/fd/{fd}")
                   for fd in os.listdir(f"/proc/{proc.pid}/fd"))
    assert left <= baseline + 2, (baseline, left, [x for x in links if "trainguard" in x][:8])


def test_an_event_id_past_sqlites_range_is_a_400_and_no_traceback(
        ui: tuple[subprocess.Popen[str], int, str]) -> None:
    proc, port, jid = ui
    base = f"http://127.0.0.1:{port}/api/jobs/{jid}"
    for url, headers in ((f"{base}/events?after={TOO_BIG}", {}),
                         (f"{base}/stream?after={TOO_BIG}", {}),
                         (f"{base}/stream", {"Last-Event-ID": "9" * 23})):
        r = httpx.get(url, headers=headers, timeout=10)
        assert r.status_code == 400, (url, r.status_code, r.text)
        assert "9223372036854775807" in r.json()["error"], r.text
    ok = httpx.get(f"{base}/events?after={2**63 - 1}", timeout=10)
    assert ok.status_code == 200 and ok.json()["events"] == []
    # the log's path numbers too (review of walk-through 32 #7: the route's int convertor
    # ran int() on 5,000 digits, a ValueError and a 500 with a traceback)
    for attempt, rank, name in (("9" * 5000, "0", "attempt"), ("0", TOO_BIG, "rank"),
                                ("-1", "0", "attempt"), ("x", "0", "attempt")):
        r = httpx.get(f"{base}/logs/{attempt}/{rank}", timeout=10)
        assert r.status_code == 400 and name in r.json()["error"], (name, r.status_code, r.text)
        assert len(r.text) < 300, r.text[:300]
    assert httpx.get(f"{base}/logs/0/{2**63 - 1}", timeout=10).status_code == 404
    err = stderr_after_stop(proc)
    assert "Traceback" not in err and "OverflowError" not in err, err


def test_bad_numbers_name_the_range_and_do_not_echo_a_huge_value(tmp_path: Path) -> None:
    make_job(tmp_path / "j").close()
    jid = job_id((tmp_path / "j").resolve())
    with api_client(Catalog([tmp_path / "j"])) as c:
        r = c.get(f"/api/jobs/{jid}/events?limit={'9' * 5000}")
        assert r.status_code == 400 and len(r.text) < 300, r.text[:300]
        assert "limit" in r.json()["error"]
        r = c.get(f"/api/jobs/{jid}/logs/0/1?line={TOO_BIG}")
        assert r.status_code == 400 and "out of range" in r.json()["error"]
        r = c.get(f"/api/jobs/{jid}/stream", headers={"Last-Event-ID": TOO_BIG})
        assert r.status_code == 400 and "Last-Event-ID" in r.json()["error"]
