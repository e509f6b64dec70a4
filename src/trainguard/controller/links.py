"""One thread reads every authenticated agent link (edge-triggered epoll).

A thread per link made thousands of threads queue for the GIL, so the hub learnt of a
dropped link seconds late. The hub's handshake threads hand each welcomed connection over
with add(); this thread then, in turns:
- asks epoll which links got bytes since it last asked (edge-triggered: new bytes only,
  not bytes still unread) and which peers hung up, and notes the time before it parses
  anything (each link's `Heard`; `on_hangup` at once). Liveness never waits on parsing: a
  reader seconds behind (a burst of reports, a starved CPU) neither makes a live node look
  silent nor keeps a gone one present;
- reads the links with bytes pending, round robin, for at most SLICE_S before it asks epoll
  again; completes frames (Conn.feed, which checks each frame's MAC and sequence number)
  and calls `on_frame`;
- ends a link (closed, broken, a forged or malformed frame) by unregistering and closing it
  and calling `on_closed` once.
Other threads end a link with Conn.shutdown(), never close(): this thread sees the end.
Linux (epoll), as the rest of the launcher.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainguard.protocol import NodeReport, WorkerMessage
from trainguard.wire import Conn, WireError

READ_BYTES = 1 << 18
JOIN_TIMEOUT_S = 5.0
SLICE_S = 0.05  # reading between two looks at epoll: the lag of an arrival or a hangup
IDLE_WAIT_S = 0.5
_ARRIVED = select.EPOLLIN | select.EPOLLRDHUP | select.EPOLLET
_HANGUP = select.EPOLLRDHUP | select.EPOLLHUP | select.EPOLLERR

OnFrame = Callable[[Any, dict[str, Any]], None]  # (the link's context, the frame)
OnHangup = Callable[[Any, float], None]  # (context, when the peer hung up: monotonic)
OnClosed = Callable[[Any, Conn, Exception], None]


class Heard:
    """When a link was last heard from (monotonic seconds), as its reader knows it. Bytes
    not parsed yet count from when they came; once parsed, only a valid frame (its MAC
    checked) keeps that credit: bytes that never make a frame keep nobody alive. The reader
    thread writes, any thread may read at()."""

    def __init__(self, at: float = 0.0) -> None:
        self.valid_at = at  # when the bytes of its last valid frame came
        self.unread_at: float | None = None  # bytes came then and are not all parsed yet

    def arrived(self, at: float) -> None:
        self.unread_at = at

    def parsed(self, frames: int, all_read: bool) -> None:
        """One read was parsed into `frames` valid frames; `all_read`: none left unread."""
        came = self.unread_at
        if frames and came is not None and came > self.valid_at:
            self.valid_at = came  # before unread_at is cleared: at() never goes back
        if all_read:
            self.unread_at = None

    def at(self) -> float:
        came = self.unread_at
        return self.valid_at if came is None else max(came, self.valid_at)


@dataclass
class _Link:
    conn: Conn
    context: Any
    heard: Heard
    hung_up: bool = False  # the peer hung up: read on until the end, then close


@dataclass
class NodeLink:
    name: str
    host: str = ""
    addr: str = ""
    agent_pid: int | None = None
    conn: Conn | None = None
    generation: int = 0
    heard: Heard = field(default_factory=Heard)  # this connection's (the reader updates it)
    hangup_at: float | None = None  # its peer hung up; the reader still reads what is left
    disconnected_at: float | None = None
    reports: deque[NodeReport] = field(default_factory=deque)  # appended without the lock
    hello_report: NodeReport | None = None
    # the kept messages (node/outbox.py) of a numbered reply that came after its call gave
    # up: the next pushed report carries them, so they are recorded before they are
    # acknowledged (an acknowledgement is cumulative: a later report's would drop them)
    late: deque[WorkerMessage] = field(default_factory=deque)

    def take_reports(self, then: NodeReport | None = None) -> list[NodeReport]:
        """The reports pushed since the last take, then `then` (a command's reply report),
        the first led by the late messages: one path records them all."""
        out: list[NodeReport] = []
        while self.reports:
            out.append(self.reports.popleft())
        if then is not None:
            out.append(then)
        if out and self.late:
            late: list[WorkerMessage] = []
            while self.late:
                late.append(self.late.popleft())
            out[0] = out[0].model_copy(update={"messages": [*late, *out[0].messages]})
        return out

    def keep_late(self, body: Any) -> None:
        """The kept messages (with an id) of a reply that is a numbered report."""
        if not isinstance(body, dict) or body.get("seq") is None or "node" not in body:
            return
        try:
            report = NodeReport.model_validate(body)
        except ValueError:
            return
        self.late.extend(m for m in report.messages if m.id is not None)

    def up(self) -> bool:
        return self.conn is not None and self.hangup_at is None

    def down_for(self, now: float) -> float:
        """Seconds since its link went down (hung up or ended); 0 while up."""
        since = self.hangup_at if self.conn is not None else self.disconnected_at
        return 0.0 if since is None else now - since


@dataclass(frozen=True)
class LinkState:
    """One node's link at one instant (Hub.links_now: every node under one lock)."""

    connected: bool
    silent_s: float  # since its last frame
    disconnected_s: float  # 0 while connected (or never connected)


class LinkReader:
    def __init__(self, on_frame: OnFrame, on_closed: OnClosed,
                 on_hangup: OnHangup | None = None) -> None:
        self._on_frame, self._on_closed = on_frame, on_closed
        self._on_hangup = on_hangup or (lambda _context, _at: None)
        self._ep = select.epoll()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._ep.register(self._wake_r.fileno(), select.EPOLLIN)
        self._links: dict[int, _Link] = {}  # by fd
        self._pending: dict[int, None] = {}  # fds with bytes to read, oldest first
        self._new: deque[tuple[Conn, Any, Heard]] = deque()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trainguard-links", daemon=True)
        self._thread.start()

    def add(self, conn: Conn, context: Any, heard: Heard | None = None) -> None:
        """Read `conn` from now on and keep `heard` up to date; `context` is handed to the
        callbacks."""
        self._new.append((conn, context, heard or Heard(time.monotonic())))
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def _run(self) -> None:
        while not self._stop.is_set():
            events = self._ep.poll(0 if self._pending else IDLE_WAIT_S)
            now = time.monotonic()
            for fd, ev in events:
                link = self._links.get(fd)
                if link is None:  # the wake-up socket
                    with contextlib.suppress(OSError):
                        self._wake_r.recv(4096)
                    continue
                link.heard.arrived(now)
                if ev & _HANGUP and not link.hung_up:
                    link.hung_up = True
                    self._on_hangup(link.context, now)
                self._pending.setdefault(fd)  # keeps its turn when already waiting
            while self._new:
                self._register(*self._new.popleft())
            self._read_pending(now + SLICE_S)

    def _register(self, conn: Conn, context: Any, heard: Heard) -> None:
        try:
            fd = conn.sock.fileno()
            self._ep.register(fd, _ARRIVED)  # bytes already there count as an arrival now
        except (ValueError, OSError) as e:  # closed before it got here
            self._on_closed(context, conn, e)
            return
        self._links[fd] = _Link(conn, context, heard)

    def _read_pending(self, until: float) -> None:
        """Read the waiting links in turn, one read each, until `until` (one read at least)."""
        while self._pending:
            fd = next(iter(self._pending))
            del self._pending[fd]
            link = self._links.get(fd)
            if link is not None:
                self._read(fd, link)
            if time.monotonic() >= until:
                return

    def _read(self, fd: int, link: _Link) -> None:
        conn = link.conn
        try:  # the fd does not block (the socket has a send timeout): one read(), no poll()
            data = os.read(fd, READ_BYTES)
            if not data:
                raise WireError(f"{conn.peer} closed the connection")
            frames = conn.feed(data)
        except BlockingIOError:  # nothing left after a full read
            link.heard.parsed(0, all_read=True)
            return
        except (WireError, OSError) as e:
            self._end(fd, link, e)
            return
        # edge-triggered: no new event for bytes left unread, nor for the end after a hangup
        more = link.hung_up or len(data) == READ_BYTES
        if more:
            self._pending[fd] = None
        link.heard.parsed(len(frames), all_read=not more)
        for msg in frames:
            self._on_frame(link.context, msg)

    def _end(self, fd: int, link: _Link, e: Exception) -> None:
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._ep.unregister(fd)
        self._links.pop(fd, None)
        self._pending.pop(fd, None)
        link.conn.close()
        self._on_closed(link.context, link.conn, e)

    def close(self) -> None:
        """Stop reading, join the thread and close the links it read (once)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._wake()
        if self._thread is not threading.current_thread():
            self._thread.join(JOIN_TIMEOUT_S)
        for link in list(self._links.values()):
            link.conn.close()
        self._links.clear()
        self._ep.close()
        self._wake_r.close()
        self._wake_w.close()
