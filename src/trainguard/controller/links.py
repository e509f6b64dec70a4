"""One thread reads every authenticated agent link (epoll through `selectors`).

A thread per link made thousands of threads queue for the GIL, so the hub learnt of a
dropped link seconds late. The hub's handshake threads hand each welcomed connection over
with add(); this thread reads what the kernel has, completes frames (Conn.feed, which checks
each frame's MAC and sequence number) and calls `on_frame`; when a link ends (closed, broken,
a forged or malformed frame) it unregisters and closes it and calls `on_closed` once. Other
threads end a link with Conn.shutdown(), never close(): this thread sees the end.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from trainguard.wire import Conn, WireError

READ_BYTES = 1 << 18
JOIN_TIMEOUT_S = 5.0

OnFrame = Callable[[Any, dict[str, Any]], None]  # (the link's context, the frame)
OnClosed = Callable[[Any, Conn, Exception], None]


class LinkReader:
    def __init__(self, on_frame: OnFrame, on_closed: OnClosed) -> None:
        self._on_frame, self._on_closed = on_frame, on_closed
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._new: deque[tuple[Conn, Any]] = deque()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trainguard-links", daemon=True)
        self._thread.start()

    def add(self, conn: Conn, context: Any) -> None:
        """Read `conn` from now on; `context` is handed to the callbacks."""
        self._new.append((conn, context))
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def _run(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._sel.select(0.5):
                if key.data is None:
                    with contextlib.suppress(OSError):
                        self._wake_r.recv(4096)
                    continue
                self._read(*key.data)
            while self._new:
                conn, context = self._new.popleft()
                try:
                    self._sel.register(conn.sock, selectors.EVENT_READ, (conn, context))
                except (ValueError, KeyError, OSError) as e:  # closed before it got here
                    self._on_closed(context, conn, e)

    def _read(self, conn: Conn, context: Any) -> None:
        try:
            data = conn.sock.recv(READ_BYTES)
            if not data:
                raise WireError(f"{conn.peer} closed the connection")
            frames = conn.feed(data)
        except (WireError, OSError) as e:
            self._end(conn, context, e)
            return
        for msg in frames:
            self._on_frame(context, msg)

    def _end(self, conn: Conn, context: Any, e: Exception) -> None:
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._sel.unregister(conn.sock)
        conn.close()
        self._on_closed(context, conn, e)

    def close(self) -> None:
        """Stop reading, join the thread and close the links it read (once)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._wake()
        if self._thread is not threading.current_thread():
            self._thread.join(JOIN_TIMEOUT_S)
        for key in list(self._sel.get_map().values()):
            if key.data is not None:
                key.data[0].close()
        self._sel.close()
        self._wake_r.close()
        self._wake_w.close()
