"""Which connections the hub lets into a handshake, and what it does when accept() fails.

Before the handshake a peer is nobody: at most MAX_HANDSHAKES connections, and
MAX_HANDSHAKES_PER_HOST from one address, may be in one at once; the rest are closed at
once. accept() running out of fds, buffers or memory waits ACCEPT_BACKOFF_S and goes on;
other errors go on at once. Warnings come at most every WARN_EVERY_S (a flood must not
flood the log too).
"""

from __future__ import annotations

import errno
import logging
import threading
import time

from trainguard.wire import out_of_fds

log = logging.getLogger("trainguard.controller.hub")

MAX_HANDSHAKES = 256  # connections not authenticated yet, all peers together
MAX_HANDSHAKES_PER_HOST = 64  # from one address (the local backend's agents share one)
ACCEPT_BACKOFF_S = 0.1  # after accept() ran out of fds (or memory)
WARN_EVERY_S = 10.0
_TRANSIENT = (errno.ECONNABORTED, errno.EINTR, errno.EPROTO, errno.EAGAIN)


class Admission:
    def __init__(self) -> None:
        self._pending: dict[str, int] = {}  # peer address -> connections in handshake
        self._lock = threading.Lock()
        self._warned = -WARN_EVERY_S

    def enter(self, host: str) -> bool:
        """Count one more connection from `host` in its handshake; False: refuse it."""
        with self._lock:
            if (sum(self._pending.values()) >= MAX_HANDSHAKES
                    or self._pending.get(host, 0) >= MAX_HANDSHAKES_PER_HOST):
                full = True
            else:
                self._pending[host] = self._pending.get(host, 0) + 1
                full = False
        if full:
            self.warn("too many unauthenticated connections (from %s): refusing new ones "
                      "until their handshakes end", host)
        return not full

    def leave(self, host: str) -> None:
        with self._lock:
            left = self._pending.get(host, 0) - 1
            if left > 0:
                self._pending[host] = left
            else:
                self._pending.pop(host, None)

    def accept_failed(self, e: OSError) -> None:
        if out_of_fds(e):
            self.warn("accept() failed (%s): retrying in %.1fs", e, ACCEPT_BACKOFF_S)
            time.sleep(ACCEPT_BACKOFF_S)
        elif e.errno not in _TRANSIENT:
            self.warn("accept() failed (%s): retrying", e)
            time.sleep(ACCEPT_BACKOFF_S)

    def warn(self, fmt: str, *args: object) -> None:
        if time.monotonic() - self._warned > WARN_EVERY_S:
            self._warned = time.monotonic()
            log.warning(fmt, *args)
