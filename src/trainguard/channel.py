"""The agent's end of the worker channel: receives workers' JSON datagrams.

Workers send with trainguard.worker.channel.send(); the agent binds an abstract Unix socket
(no file to clean up, no path length limit) and takes what arrived at each poll; the
kernel keeps unread datagrams meanwhile (a sender drops, never blocks, when it is full).
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
from typing import Any

log = logging.getLogger(__name__)

MAX_PER_DRAIN = 10_000


class ChannelServer:
    def __init__(self, name: str) -> None:
        self.name = name  # `@name` form, as workers get it in TRAINGUARD_AGENT_SOCKET
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind("\0" + name.removeprefix("@"))
        self._sock.setblocking(False)

    def drain(self) -> list[dict[str, Any]]:
        """Every well-formed message received since the last drain, in arrival order."""
        out: list[dict[str, Any]] = []
        for _ in range(MAX_PER_DRAIN):
            try:
                data = self._sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                break
            try:
                msg = json.loads(data)
            except ValueError:
                log.debug("dropped a malformed worker message")
                continue
            if isinstance(msg, dict) and isinstance(msg.get("kind"), str):
                out.append(msg)
        return out

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()
