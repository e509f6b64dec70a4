"""Which connections the hub lets into a handshake, and what it does when accept() fails.

Before the handshake a peer is nobody: at most MAX_HANDSHAKES connections, and
MAX_HANDSHAKES_PER_HOST from one address, may be in one at once; the rest are closed at
once. A loopback connection from a process of the controller's own user (the local
backend's agents; /proc/net/tcp names each socket's owner) counts apart, with a budget of
its own: another local user holding 64 handshakes open no longer keeps the job's agents out
(walk-through 32 #2). accept() running out of fds, buffers or memory waits ACCEPT_BACKOFF_S
and goes on; other errors go on at once. Refused handshakes are counted (`refused`) and,
like the rest, told at most every WARN_EVERY_S with how many (a flood must not flood the
log too: walk-through 32 #3 wrote a line a connection).
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time

from trainguard.sockowner import client_uid
from trainguard.wire import out_of_fds

log = logging.getLogger("trainguard.controller.hub")

MAX_HANDSHAKES = 256  # connections not authenticated yet, all peers together
MAX_HANDSHAKES_PER_HOST = 64  # from one address (the local backend's agents share one)
ACCEPT_BACKOFF_S = 0.1  # after accept() ran out of fds (or memory)
WARN_EVERY_S = 10.0
_TRANSIENT = (errno.ECONNABORTED, errno.EINTR, errno.EPROTO, errno.EAGAIN)


OWN = "own user"  # the key of loopback connections of the controller's own user


class Admission:
    def __init__(self) -> None:
        self._pending: dict[str, int] = {}  # peer address (or OWN) -> connections in handshake
        self._lock = threading.Lock()
        self._warned = -WARN_EVERY_S
        self.refused = 0  # handshakes that failed (no token, garbage, too slow), in all
        self.over_budget = 0  # connections closed at once: too many in their handshake
        self._refused_told = 0

    def key(self, peer: tuple[str, int], server: tuple[str, int]) -> str:
        """Whose budget a new connection counts in: OWN for a loopback peer of our own user
        (looked up only when its address has no room left), else its address. `server`: the
        accepted socket's own address, which the client's row names (a listener on every
        interface is 0.0.0.0, in no row: review of walk-through 32 #2)."""
        host = peer[0]
        with self._lock:
            room = self._pending.get(host, 0) < MAX_HANDSHAKES_PER_HOST and \
                sum(self._pending.values()) < MAX_HANDSHAKES
        if room:
            return host
        return OWN if client_uid(peer, server) == os.geteuid() else host

    def enter(self, key: str) -> bool:
        """Count one more connection in its handshake under `key` (Admission.key); False:
        refuse it. The own user's loopback connections are capped apart, by the per-address
        cap alone."""
        with self._lock:
            if key == OWN:
                full = self._pending.get(OWN, 0) >= MAX_HANDSHAKES_PER_HOST
            else:
                full = (sum(n for k, n in self._pending.items() if k != OWN) >= MAX_HANDSHAKES
                        or self._pending.get(key, 0) >= MAX_HANDSHAKES_PER_HOST)
            if not full:
                self._pending[key] = self._pending.get(key, 0) + 1
            else:
                self.over_budget += 1
        if full:
            self.warn("too many unauthenticated connections (from %s): refusing new ones "
                      "until their handshakes end", key)
        return not full

    def refuse(self, why: str) -> None:
        """A connection whose handshake failed: counted, and told with how many at most
        every WARN_EVERY_S."""
        with self._lock:
            self.refused += 1
            since = self.refused - self._refused_told
        if self.warn("refused %d connection(s) that did not complete a handshake (the last: "
                     "%s)", since, why):
            self._refused_told += since

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

    def warn(self, fmt: str, *args: object) -> bool:
        """Log a warning unless one came within WARN_EVERY_S; whether it was logged."""
        if time.monotonic() - self._warned > WARN_EVERY_S:
            self._warned = time.monotonic()
            log.warning(fmt, *args)
            return True
        return False
