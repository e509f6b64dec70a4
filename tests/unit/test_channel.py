"""Worker -> agent messages over a real abstract Unix datagram socket."""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import subprocess
import sys
import uuid

import pytest

from trainguard.node.channel import ChannelServer, JobProcesses
from trainguard.worker import channel


def test_messages_sent_by_a_worker_reach_the_agent_in_order(
        monkeypatch: pytest.MonkeyPatch) -> None:
    server = ChannelServer(f"@tg-test-{uuid.uuid4().hex[:8]}")
    try:
        monkeypatch.setenv(channel.ENV_SOCKET, server.name)
        monkeypatch.setenv("RANK", "3")
        assert channel.send("checkpoint_saved", step=10, location="/x")
        assert channel.send("resumed", step=10)
        got = server.drain()
        assert [(m["kind"], m["rank"], m["step"]) for m in got] == [
            ("checkpoint_saved", 3, 10), ("resumed", 3, 10)]
        assert server.drain() == []
    finally:
        server.close()


def test_without_a_launcher_sending_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(channel.ENV_SOCKET, raising=False)
    assert channel.send("resumed", step=1) is False


def test_a_gone_agent_never_fails_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(channel.ENV_SOCKET, f"@tg-nobody-{uuid.uuid4().hex[:8]}")
    assert channel.send("resumed", step=1) is False


def test_malformed_datagrams_are_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    server = ChannelServer(f"@tg-test-{uuid.uuid4().hex[:8]}")
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        addr = "\0" + server.name[1:]
        for junk in (b"\xff\xfe not json", b"[1, 2]", b'{"no_kind": 1}'):
            s.sendto(junk, addr)
        s.sendto(b'{"kind": "resumed", "step": 4}', addr)
        assert [m["kind"] for m in server.drain()] == ["resumed"]
    finally:
        server.close()


SEND_ONE = """
import os, socket, sys
if len(sys.argv) > 2:
    os.setuid(int(sys.argv[2]))
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.sendto(b'{"kind": "resumed", "step": %d}' % os.getpid(), "\\0" + sys.argv[1][1:])
"""


def _send_from_child(addr: str, *uid: int, new_session: bool = True) -> int:
    p = subprocess.run([sys.executable, "-c", SEND_ONE, addr, *map(str, uid)],
                       start_new_session=new_session, check=True, timeout=30)
    return p.returncode


def test_only_the_jobs_processes_may_send(caplog: pytest.LogCaptureFixture) -> None:
    """Abstract sockets have no permissions: the kernel's credentials of each datagram
    decide. Another user's process and this user's processes outside the job's sessions
    are dropped, with a warning; a worker's (its session) is kept."""
    groups: set[int] = set()
    server = ChannelServer(f"@tg-test-{uuid.uuid4().hex[:8]}", JobProcesses(groups))
    addr = "\0" + server.name[1:]
    try:
        with caplog.at_level(logging.WARNING):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            s.sendto(b'{"kind": "resumed", "step": 1}', addr)  # not a job process
            assert server.drain() == [] and server.dropped == 1
        assert "not a process of this job" in caplog.text
        groups.add(os.getsid(0))  # the test's session plays the worker's
        _send_from_child(server.name, new_session=False)  # a worker's child: same session
        assert [m["kind"] for m in server.drain()] == ["resumed"]
        if os.getuid() == 0:
            _send_from_child(server.name, 65534, new_session=False)  # another user
            assert server.drain() == [] and server.dropped == 2
    finally:
        server.close()


@pytest.mark.parametrize("fields", [
    {"step": 1, "at": 1e300}, {"step": 1, "at": math.nan}, {"step": "x"}, {"step": None},
    {"step": 1e400}, {"step": 1, "rank": 10**20}, {"step": 1, "pid": -5}])
def test_a_bad_field_drops_the_message_and_never_the_server(fields: dict[str, object]) -> None:
    server = ChannelServer(f"@tg-test-{uuid.uuid4().hex[:8]}")
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        addr = "\0" + server.name[1:]
        s.sendto(json.dumps({"kind": "progress", **fields}).encode(), addr)
        s.sendto(b'{"kind": "progress", "step": 2}', addr)
        assert [m["step"] for m in server.drain()] == [2] and server.dropped == 1
    finally:
        server.close()


def test_a_full_queue_is_waited_for_a_message_the_next_one_does_not_supersede(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Linux keeps 10 datagrams a Unix socket (net.unix.max_dgram_qlen): an agent that read
    late under load lost a `resumed` (CI: no Resumed event after an exact resume). Now such a
    message is tried again for up to a second; progress is still dropped at once."""
    import threading
    import time

    name = f"tg-full-{uuid.uuid4().hex[:8]}"
    agent = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    agent.bind("\0" + name)
    try:
        monkeypatch.setenv(channel.ENV_SOCKET, "@" + name)
        monkeypatch.setattr(channel, "RETRY_S", 10.0)  # a loaded machine may read later
        sent = 0
        while channel.send("progress", step=sent) and sent < 10_000:
            sent += 1  # until the queue is full
        assert 0 < sent < 10_000
        t0 = time.monotonic()
        assert channel.send("progress", step=sent) is False  # dropped at once
        assert time.monotonic() - t0 < 0.1

        def read_late() -> None:
            time.sleep(0.3)
            agent.settimeout(2)
            for _ in range(sent + 1):
                agent.recv(65536)

        reader = threading.Thread(target=read_late)
        reader.start()
        t0 = time.monotonic()
        assert channel.send("resumed", step=10)  # waits for room, then goes
        assert 0.2 < time.monotonic() - t0 < channel.RETRY_S
        reader.join()
    finally:
        agent.close()


def test_a_message_that_finds_no_room_for_a_second_is_dropped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    name = f"tg-stuck-{uuid.uuid4().hex[:8]}"
    agent = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    agent.bind("\0" + name)
    try:
        monkeypatch.setenv(channel.ENV_SOCKET, "@" + name)
        while channel.send("progress", step=1):
            pass
        t0 = time.monotonic()
        assert channel.send("resumed", step=10) is False
        assert channel.RETRY_S <= time.monotonic() - t0 < channel.RETRY_S + 5.0
    finally:
        agent.close()


def test_a_child_forked_while_another_thread_sends_can_send(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 39 #9: a DataLoader worker forked while the checkpoint thread was inside send()
    got the lock held and blocked forever at its first message (inject_loader's report)."""
    import multiprocessing
    import threading
    import time

    monkeypatch.setenv(channel.ENV_SOCKET, f"@tg-test-nobody-{uuid.uuid4().hex}")
    held, release = threading.Event(), threading.Event()

    def sender() -> None:
        with channel._lock:
            held.set()
            release.wait(10)

    t = threading.Thread(target=sender, daemon=True)
    t.start()
    held.wait(5)
    try:
        child = multiprocessing.get_context("fork").Process(
            target=channel.send, args=(channel.MessageKind.PROGRESS,), kwargs={"step": 1})
        start = time.monotonic()
        child.start()
        child.join(5)
        alive = child.is_alive()
        if alive:
            child.kill()
        assert not alive and child.exitcode == 0 and time.monotonic() - start < 5
    finally:
        release.set()
        t.join(5)
