"""The live /metrics endpoint in the controller process is bounded (walk-through 32 #7):
prometheus-client's server took a thread and an fd per open connection with no timeout and
no cap, and every scrape at once left an fd on trainguard.db for good (SQLite keeps a closed
connection's fd while the controller's writer, in the same process, holds a lock on the
file). Real sockets, a real store with its writer open in this process, as the controller."""

from __future__ import annotations

import contextlib
import os
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainguard.controller.store import JobStore
from trainguard.goodput import metrics_server
from trainguard.goodput.metrics import serve


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def settle(check: object, timeout_s: float = 8.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.05)


@pytest.fixture
def endpoint(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """A job's store with its writer open here (the controller's), and its /metrics."""
    with JobStore.create(tmp_path / "job", "r") as writer:
        writer.set_meta(state="running")
        url, close = serve(tmp_path / "job", "127.0.0.1", 0)
        try:
            yield url, int(url.split(":")[2].split("/")[0])
        finally:
            close()


def half_requests(port: int, n: int) -> list[socket.socket]:
    """`n` connections that send a request line and then wait (no end of headers)."""
    out = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        with contextlib.suppress(OSError):  # one refused at once may be closed already
            s.sendall(b"GET /metrics HTTP/1.1\r\n")
        out.append(s)
    return out


def scrape(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.status == 200
        return bytes(r.read())


def test_many_half_open_connections_take_a_bounded_number_of_threads_and_leave_no_fds(
        endpoint: tuple[str, int]) -> None:
    url, port = endpoint
    scrape(url)  # the first scrape's own handles, for the baseline
    time.sleep(0.3)  # its thread ends
    base_threads, base_fds = threads(), fds()
    clients = half_requests(port, 60)
    time.sleep(0.5)
    assert threads() <= base_threads + metrics_server.MAX_CONNECTIONS
    for s in clients:  # gone mid-request: each open one is answered, to nobody
        s.close()
    settle(lambda: threads() <= base_threads and fds() <= base_fds + 1)
    assert threads() <= base_threads
    assert fds() <= base_fds + 1, sorted(os.readlink(f"/proc/self/fd/{n}")
                                         for n in os.listdir("/proc/self/fd"))
    assert b"trainguard_job_state" in scrape(url)  # and it still answers


def test_a_client_that_sends_little_is_cut_at_the_deadline_and_a_full_house_refuses(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics_server, "REQUEST_DEADLINE_S", 1.0)
    monkeypatch.setattr(metrics_server, "MAX_CONNECTIONS", 3)
    with JobStore.create(tmp_path / "job", "r"):
        url, close = serve(tmp_path / "job", "127.0.0.1", 0)
        port = int(url.split(":")[2].split("/")[0])
        try:
            slow = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(3)]
            time.sleep(0.3)
            extra = socket.create_connection(("127.0.0.1", port), timeout=5)
            assert extra.recv(100) == b""  # closed at once: 3 are open
            extra.close()
            t0 = time.monotonic()
            slow[0].sendall(b"GET /met")  # the per-read timeout alone cuts these
            for s in slow:
                assert s.recv(100) == b""  # cut by the server
            assert time.monotonic() - t0 < 3.0
            for s in slow:
                s.close()
            assert b"trainguard_job_state" in scrape(url)
        finally:
            close()


def test_a_trickling_client_is_cut_at_the_whole_connections_deadline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A byte every 0.3 s keeps every read under its timeout: only the serve loop's deadline
    over the whole connection cuts it (review of walk-through 32 #4: the test above sends
    one chunk and passed with that deadline removed)."""
    monkeypatch.setattr(metrics_server, "REQUEST_DEADLINE_S", 1.0)
    with JobStore.create(tmp_path / "job", "r"):
        url, close = serve(tmp_path / "job", "127.0.0.1", 0)
        port = int(url.split(":")[2].split("/")[0])
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            t0, cut_after = time.monotonic(), None
            for byte in b"GET /metrics HTTP/1.1\r\nX-Trickle: " + b"a" * 20:
                try:
                    s.sendall(bytes([byte]))
                    s.settimeout(0.3)  # and wait for the next byte's turn
                    if s.recv(100) == b"":
                        cut_after = time.monotonic() - t0
                        break
                except TimeoutError:
                    continue
                except OSError:  # reset: cut too
                    cut_after = time.monotonic() - t0
                    break
            s.close()
            assert cut_after is not None and cut_after < 2.5, cut_after
            assert b"trainguard_job_state" in scrape(url)
        finally:
            close()
