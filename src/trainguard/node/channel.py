"""The agent's end of the worker channel: receives workers' JSON datagrams.

Workers send with trainguard.worker.channel.send(); the agent binds an abstract Unix socket
(no file to clean up, no path length limit). A reader thread takes datagrams as they come,
because the kernel queues only a few (net.unix.max_dgram_qlen, 10 by default) and a sender
drops, never blocks, when the queue is full; each poll takes what the thread gathered.
Each datagram is checked against the worker contract (worker.contract.parse_message): one
that is not JSON, of an unknown kind, or with a missing, mistyped or out-of-bounds field is
dropped with a debug log.
"""

from __future__ import annotations

import contextlib
import json
import logging
import select
import socket
import threading
from collections import deque
from typing import Any

from trainguard.worker.contract import ContractError, control_socket, parse_message

log = logging.getLogger(__name__)

MAX_KEPT = 100_000  # messages kept between two drains (the oldest go first)


class ChannelServer:
    def __init__(self, name: str) -> None:
        self.name = name  # `@name` form, as workers get it in contract.ENV_SOCKET
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind("\0" + name.removeprefix("@"))
        self._sock.setblocking(False)
        self._got: deque[dict[str, Any]] = deque(maxlen=MAX_KEPT)
        self._lock = threading.Lock()  # every read happens under it: arrival order is kept
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="trainguard-channel",
                                        daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._closed.is_set():
            try:
                ready, _, _ = select.select([self._sock], [], [], 0.2)
            except (OSError, ValueError):  # closed
                return
            if ready:
                with self._lock:
                    self._read_all()

    def _read_all(self) -> None:
        while True:
            try:
                data = self._sock.recv(65536)
            except (BlockingIOError, InterruptedError, OSError):
                return
            try:
                msg = parse_message(json.loads(data))
            except ContractError as e:
                log.debug("dropped a worker message: %s", e)
                continue
            except (ValueError, RecursionError):  # not JSON (or nested past the parser)
                log.debug("dropped a malformed worker message (not JSON)")
                continue
            self._got.append(msg)

    def drain(self) -> list[dict[str, Any]]:
        """Every valid message received since the last drain, in arrival order (each as
        contract.parse_message returns it: `kind` a MessageKind)."""
        with self._lock:
            self._read_all()
            out = list(self._got)
            self._got.clear()
        return out

    def close(self) -> None:
        self._closed.set()
        with self._lock, contextlib.suppress(OSError):
            self._sock.close()
        self._thread.join(timeout=1.0)

    def tell(self, ranks: list[int], msg: dict[str, Any]) -> int:
        """The other direction: one control datagram (worker.contract.ControlKind) to each
        rank (worker/control.py); how many were handed to the kernel (a rank that does not
        listen: not)."""
        data = json.dumps(msg).encode()
        told = 0
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.setblocking(False)
            for rank in ranks:
                name = control_socket(self.name, rank)
                try:
                    s.sendto(data, "\0" + name.removeprefix("@"))
                    told += 1
                except OSError as e:  # nobody listens there (or its queue is full)
                    log.debug("rank %s: control message not delivered (%s)", rank, e)
        return told
