"""Worker -> agent messages over a real abstract Unix datagram socket."""

from __future__ import annotations

import socket
import uuid

import pytest

from trainguard.node.channel import ChannelServer
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
