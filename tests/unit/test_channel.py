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
