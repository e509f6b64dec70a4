"""The agent's end of the worker channel: receives workers' JSON datagrams.

Workers send with trainguard.worker.channel.send(); the agent binds an abstract Unix socket
(no file to clean up, no path length limit) and a reader thread keeps the messages, bounded,
until the next poll takes them.
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

log = logging.getLogger(__name__)

MAX_QUEUED = 10_000


class ChannelServer:
    def __init__(self, name: str) -> None:
        self.name = name  # `@name` form, as workers get it in TRAINGUARD_AGENT_SOCKET
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind("\0" + name.removeprefix("@"))
        self._queue: deque[dict[str, Any]] = deque(maxlen=MAX_QUEUED)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trainguard-channel",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self._sock], [], [], 0.2)
            if not ready:
                continue
            try:
                data = self._sock.recv(65536)
            except OSError:
                continue
            try:
                msg = json.loads(data)
            except ValueError:
                log.debug("dropped a malformed worker message")
                continue
            if isinstance(msg, dict) and isinstance(msg.get("kind"), str):
                with self._lock:
                    self._queue.append(msg)

    def drain(self) -> list[dict[str, Any]]:
        with self._lock:
            out = list(self._queue)
            self._queue.clear()
        return out

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        with contextlib.suppress(OSError):
            self._sock.close()
