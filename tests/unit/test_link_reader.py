"""Loss detection does not wait on parsing (issue 16, scale): the controller's one link
reader notes when each link's bytes come and when its peer hangs up before it parses
anything, so a reader seconds behind (a burst of 2,000 reports on a starved CPU) neither
makes a live node look silent, nor a silent one look heard late, nor sees a hangup late.

`Heard` is the rule, tested alone; then a real LinkReader on loopback sockets whose
consumer takes 0.2 s a frame (the parsing backlog) and the hub's verdicts on a real link."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from trainguard.controller.hub import Hub
from trainguard.controller.links import SLICE_S, Heard, LinkReader
from trainguard.handshake import connect
from trainguard.wire import Conn, new_token

# -- the rule --------------------------------------------------------------------------------


def test_bytes_not_parsed_yet_count_as_heard_from_when_they_came() -> None:
    heard = Heard(at=100.0)
    heard.arrived(104.0)  # the reader is behind: nothing parsed yet
    assert heard.at() == 104.0


def test_a_valid_frame_keeps_the_time_its_bytes_came_not_the_time_it_was_parsed() -> None:
    heard = Heard(at=100.0)
    heard.arrived(104.0)
    heard.parsed(frames=1, all_read=True)  # parsed at, say, 109.0
    assert heard.at() == 104.0


def test_bytes_that_make_no_valid_frame_keep_nobody_alive_once_parsed() -> None:
    heard = Heard(at=100.0)
    heard.arrived(104.0)  # a trickle of a frame that never completes (or garbage)
    heard.parsed(frames=0, all_read=True)
    assert heard.at() == 100.0


def test_bytes_still_unread_after_a_read_keep_counting() -> None:
    heard = Heard(at=100.0)
    heard.arrived(104.0)
    heard.parsed(frames=0, all_read=False)  # a big frame, half read
    assert heard.at() == 104.0
    heard.parsed(frames=1, all_read=True)
    assert heard.at() == 104.0


# -- a real reader behind a backlog -------------------------------------------------------------

PARSE_S = 0.2  # what the consumer takes per frame of the busy links
BUSY_LINKS = 10  # 2 s of backlog
# an arrival or a hangup waits at most for the read in progress (one busy frame), and for
# the CPU on a loaded machine; the backlog is ten times longer
SEEN_WITHIN_S = PARSE_S + 0.3


@pytest.fixture
def pair() -> Iterator[Callable[[], tuple[Conn, Conn]]]:
    """Connected loopback TCP pairs (agent end, controller end), closed afterwards."""
    listener = socket.create_server(("127.0.0.1", 0))
    made: list[Conn] = []

    def make() -> tuple[Conn, Conn]:
        agent = socket.create_connection(listener.getsockname())
        ours, _ = listener.accept()
        made.extend([Conn(agent), Conn(ours)])
        return made[-2], made[-1]

    yield make
    for c in made:
        c.close()
    listener.close()


def test_a_reader_behind_a_backlog_sees_a_hangup_and_an_arrival_when_they_happen(
        pair: Callable[[], tuple[Conn, Conn]]) -> None:
    hangups: dict[str, float] = {}
    parsed: dict[str, float] = {}
    busy_started = threading.Event()

    def on_frame(name: Any, msg: dict[str, Any]) -> None:
        parsed[name] = time.monotonic()
        if name.startswith("busy"):
            busy_started.set()
            time.sleep(PARSE_S)  # parsing a big report on a starved CPU

    reader = LinkReader(on_frame, lambda *_: None,
                        lambda name, at: hangups.setdefault(name, at))
    try:
        busy = [pair() for _ in range(BUSY_LINKS)]
        quiet_agent, quiet = pair()
        gone_agent, gone = pair()
        quiet_heard = Heard(time.monotonic())
        for i, (_, conn) in enumerate(busy):
            reader.add(conn, f"busy-{i}")
        reader.add(quiet, "quiet", quiet_heard)
        reader.add(gone, "gone")
        for agent, _ in busy:
            agent.send({"type": "report"})
        assert busy_started.wait(5)
        # the reader now has about 2 s of parsing to do; meanwhile one node sends its last
        # beat and goes silent, another hangs up
        beat_at = time.monotonic()
        quiet_agent.send({"type": "beat"})
        gone_agent.sock.close()
        gone_at = time.monotonic()
        time.sleep(3 * PARSE_S)
        assert "quiet" not in parsed  # still behind the backlog
        assert quiet_heard.at() >= beat_at  # but heard already, from when the beat came
        seen_by = time.monotonic() + 5  # (a loaded machine may run the reader late: the time
        while "gone" not in hangups and time.monotonic() < seen_by:  # it records tells)
            time.sleep(0.02)
        assert abs(hangups["gone"] - gone_at) < SEEN_WITHIN_S  # not seconds late
        deadline = time.monotonic() + 10
        while "quiet" not in parsed and time.monotonic() < deadline:
            time.sleep(0.05)
        assert parsed["quiet"] - beat_at > 4 * PARSE_S  # it was parsed late...
        assert quiet_heard.at() - beat_at < SEEN_WITHIN_S  # ...and credited with its arrival
    finally:
        reader.close()


def test_the_hub_counts_a_hangup_from_when_it_came() -> None:
    """The hub's view of a real agent's link: down at once when the agent hangs up, and
    heard from when its last frame came."""
    token = new_token()
    hub = Hub(token, "127.0.0.1")
    try:
        conn = connect("127.0.0.1", hub.port, token, "n0", {"agent_pid": 1})
        assert not hub.wait_connected(["n0"], 10)
        sent = time.monotonic()  # before the send: the hub may read the beat at once
        conn.send({"type": "beat"})
        deadline = time.monotonic() + 10
        while hub.silent_for("n0") > time.monotonic() - sent and time.monotonic() < deadline:
            time.sleep(0.02)
        assert hub.silent_for("n0") <= time.monotonic() - sent + SLICE_S
        conn.close()
        closed = time.monotonic()
        deadline = closed + 10
        while hub.connected("n0") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not hub.connected("n0")
        assert hub.disconnected_for("n0") <= time.monotonic() - closed + SLICE_S
    finally:
        hub.close()
