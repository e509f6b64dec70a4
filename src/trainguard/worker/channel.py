"""Messages from a worker to its node agent: JSON datagrams on a Unix socket.

The agent names the socket in TRAINGUARD_AGENT_SOCKET (an abstract name, `@...`). Sending
never blocks and never fails the training script: without a launcher, or when the agent is
gone or busy, a message is dropped. The message kinds and their fields are in
trainguard.worker.contract, which the agent checks each datagram against. Standard library
only.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from typing import Any

from trainguard.worker.contract import ENV_RANK, ENV_SOCKET, MAX_DATAGRAM_BYTES, MessageKind

__all__ = ["ENV_SOCKET", "available", "send"]

_lock = threading.Lock()
_sock: socket.socket | None = None
_addr: str | None = None


def _address() -> str | None:
    name = os.environ.get(ENV_SOCKET)
    if not name:
        return None
    return "\0" + name[1:] if name.startswith("@") else name


def available() -> bool:
    return _address() is not None


def send(kind: MessageKind, **fields: Any) -> bool:
    """Send one message (`kind` plus its fields, as worker.contract.FIELDS names them); True
    when it was handed to the kernel."""
    global _sock, _addr
    addr = _address()
    if addr is None:
        return False
    msg = {"kind": kind, "rank": _env_int(ENV_RANK), "pid": os.getpid(), "at": time.time(),
           **fields}
    data = json.dumps(msg, default=str).encode()
    if len(data) > MAX_DATAGRAM_BYTES:
        return False
    with _lock:
        try:
            if _sock is None or _addr != addr:
                _sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                _sock.setblocking(False)
                _addr = addr
            _sock.sendto(data, addr)
            return True
        except OSError:
            return False


def _env_int(name: str) -> int | None:
    v = os.environ.get(name, "")
    return int(v) if v.lstrip("-").isdigit() else None
