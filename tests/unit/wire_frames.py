"""Raw frames of the wire for the tests that play a peer by hand (test_wire_security.py,
test_handshake.py): a plain frame written and read as bytes, and the bytes a Conn would
send for a message."""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

from trainguard.wire import Conn


def raw_frame(obj: object) -> bytes:
    data = json.dumps(obj).encode()
    return struct.pack(">I", len(data)) + data


def read_raw_frame(sock: socket.socket) -> dict[str, Any]:
    """The next plain frame; ConnectionError when the peer closes first."""
    (n,) = struct.unpack(">I", _exactly(sock, 4))
    out: dict[str, Any] = json.loads(_exactly(sock, n))
    return out


def _exactly(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"closed by the peer after {len(buf)} of {n} bytes")
        buf += chunk
    return buf


class _Recorder:
    """Stands in for a Conn's socket to capture the bytes one send() would write."""

    def __init__(self) -> None:
        self.data = b""

    def sendall(self, data: bytes) -> None:
        self.data += data


def sealed(conn: Conn, msg: dict[str, Any]) -> bytes:
    """The bytes `conn` would send for `msg` (its sequence number is used up)."""
    real, rec = conn.sock, _Recorder()
    conn.sock = rec  # type: ignore[assignment]
    try:
        conn.send(msg)
    finally:
        conn.sock = real
    return rec.data
