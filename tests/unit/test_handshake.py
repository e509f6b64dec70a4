"""The handshake against a peer on the controller's address that does not know the token
(walk-through 32 #1, #11): the agent's hello is no signing oracle (a challenge that is not a
nonce gets no hello; a hello's MAC is no session key), and an agent ends only on a denial
that proves the token; a second agent the real hub supersedes does end."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.unit.wire_frames import raw_frame, read_raw_frame
from trainguard.controller import admission
from trainguard.controller.hub import Hub
from trainguard.handshake import WIRE_VERSION, Superseded, connect, session_key
from trainguard.wire import Conn, WireError, new_token

NODE = "node-1"


def send(s: socket.socket, obj: object) -> None:
    s.sendall(raw_frame(obj))


class FakeController:
    """A listener on the controller's address without the token: `answer(conn, hello)`
    plays its part after its challenge; what each agent sent is kept."""

    def __init__(self, nonce: str, answer: Callable[[socket.socket, dict[str, Any]], None]):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.hellos: list[dict[str, Any]] = []
        self._nonce, self._answer = nonce, answer
        self._t = threading.Thread(target=self._serve, daemon=True)
        self._t.start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        with conn:
            send(conn, {"type": "challenge", "nonce": self._nonce, "version": WIRE_VERSION})
            conn.settimeout(3)
            try:
                hello = read_raw_frame(conn)
            except (OSError, struct.error):
                return  # the agent hung up: it said nothing
            self.hellos.append(hello)
            self._answer(conn, hello)

    def close(self) -> None:
        self._t.join(5)
        self.sock.close()


def agent_connect(port: int, token: str) -> Exception:
    try:
        connect("127.0.0.1", port, token, NODE, {"agent_pid": 4242})
    except WireError as e:
        return e
    raise AssertionError("the agent took a peer without the token for its controller")


def test_a_challenge_that_is_not_a_nonce_gets_no_hello(hub: tuple[Hub, str]) -> None:
    """The finding's attack: the real hub's challenge N, then "session|N|X" as the fake
    controller's challenge, whose hello MAC was the session key of (N, X)."""
    h, token = hub
    real = socket.create_connection(("127.0.0.1", h.port))
    n = read_raw_frame(real)["nonce"]
    fake = FakeController(f"session|{n}|{'a' * 32}", lambda c, hello: None)
    try:
        e = agent_connect(fake.port, token)
    finally:
        fake.close()
        real.close()
    assert "is not a trainguard controller" in str(e), e
    assert fake.hellos == []  # nothing signed


def test_the_hello_macs_a_fake_controller_collects_open_no_connection(
        hub: tuple[Hub, str]) -> None:
    """A fake controller gets the agent's hello MAC for the real hub's challenge N (a relay)
    and tries for the session key of (N, X) with the challenge "session|N|X", then with X:
    no MAC it collects is the key, and a frame sealed with the best it has is refused and
    counted (on wire version 2 the second challenge's MAC was the key: accepted, 0 counted)."""
    h, token = hub
    real = socket.create_connection(("127.0.0.1", h.port))
    n, x = read_raw_frame(real)["nonce"], "b" * 32
    macs: dict[str, str] = {}
    for nonce in (n, f"session|{n}|{x}", x):
        fake = FakeController(nonce, lambda c, hello: send(c, {"type": "denied", "why": "x"}))
        try:
            agent_connect(fake.port, token)
        finally:
            fake.close()
        if fake.hellos:
            macs[nonce] = fake.hellos[0]["mac"]
    assert session_key(token, n, x, NODE) not in {bytes.fromhex(m) for m in macs.values()}
    send(real, {"type": "hello", "node": NODE, "mac": macs[n], "nonce": x,
                "version": WIRE_VERSION, "agent_pid": 4242})  # the relayed proof passes
    assert read_raw_frame(real)["type"] == "welcome"
    best = macs.get(f"session|{n}|{x}", macs[x])
    body = {"node": NODE, "attempt": 0, "workers": [], "progress": {},
            "at": "2026-12-05T00:00:00+00:00"}
    forger = Conn(real)  # sealed as the agent would, with the best key it collected
    forger.secure(bytes.fromhex(best), controller_side=False)
    forger.send({"type": "report", "body": body})
    deadline = time.monotonic() + 10
    while h.rejected_frames == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert h.rejected_frames == 1 and not h.take_all_reports()
    real.close()


def test_an_agent_does_not_end_on_a_denial_without_the_token() -> None:
    """A process that took a dead controller's port stopped every agent and its ranks with
    one unauthenticated "superseded" denial."""
    fake = FakeController("c" * 32, lambda c, hello: send(c, {
        "type": "denied", "why": "agent pid 1 serves node node-1", "superseded": True,
        "mac": "0" * 64}))
    try:
        e = agent_connect(fake.port, new_token())
    finally:
        fake.close()
    assert not isinstance(e, Superseded) and "refused node node-1" in str(e), e


def test_a_second_agent_the_hub_supersedes_does_end(hub: tuple[Hub, str]) -> None:
    h, token = hub
    first = connect("127.0.0.1", h.port, token, NODE, {"agent_pid": 1111})
    try:
        assert not h.wait_connected([NODE], 10)
        with pytest.raises(Superseded, match="agent pid 1111 serves node node-1"):
            connect("127.0.0.1", h.port, token, NODE, {"agent_pid": 2222})
    finally:
        first.close()


HOLD = """
import socket, sys, time
socks = [socket.create_connection(("127.0.0.1", int(sys.argv[1]))) for _ in range(8)]
print("holding", flush=True)
time.sleep(30)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="another local user is made with setuid (root)")
@pytest.mark.parametrize("bound", ["127.0.0.1", "0.0.0.0"])
def test_another_users_held_handshakes_do_not_keep_the_jobs_agent_out(
        bound: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """(walk-through 32 #2) Another local user held 64 connections in their handshake from
    127.0.0.1, the local backend's agents' address too: an agent that lost its link was
    refused at once until its node was lost. The controller's own user has a budget of its
    own (4 here for 4 from an address). Also for a hub on every interface (Slurm without
    --controller-host; review of walk-through 32 #2: its own user was looked up against
    0.0.0.0, which no socket table row names, and never found)."""
    monkeypatch.setattr(admission, "MAX_HANDSHAKES_PER_HOST", 4)
    token = new_token()
    h = Hub(token, bound)
    python = "/usr/bin/python3"  # the job's venv may not be another user's to run
    stranger = subprocess.Popen([python, "-c", HOLD, str(h.port)], user=65534, group=65534,
                                cwd="/", stdout=subprocess.PIPE, text=True)
    try:
        assert stranger.stdout is not None and stranger.stdout.readline() == "holding\n"
        time.sleep(0.3)
        connect("127.0.0.1", h.port, token, NODE, {"agent_pid": 4242}).close()  # at once
    finally:
        stranger.kill()
        stranger.wait()
        h.close()


def test_refused_handshakes_are_counted_and_told_once_in_a_while(
        hub: tuple[Hub, str], caplog: pytest.LogCaptureFixture) -> None:
    """(walk-through 32 #3) Each refused connection wrote a warning: 3,000 lines in 3 s."""
    h, _ = hub
    with caplog.at_level(logging.WARNING, logger="trainguard.controller.hub"):
        for _ in range(40):
            with socket.create_connection(("127.0.0.1", h.port)) as s:
                read_raw_frame(s)
                send(s, {"type": "hello", "node": NODE, "mac": "0" * 64, "nonce": "a" * 32,
                         "version": WIRE_VERSION})
                with contextlib.suppress(OSError, struct.error):
                    read_raw_frame(s)  # denied: wrong job token
        deadline = time.monotonic() + 10
        while h.refusals()["handshake"] < 40 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert h.refusals() == {"handshake": 40, "over_budget": 0, "forged_frame": 0}
    told = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(told) == 1 and "refused 1 connection(s)" in told[0] and \
        "does not know the job token" in told[0], told
