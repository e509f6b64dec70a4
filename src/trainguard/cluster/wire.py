"""Controller <-> node agent wire: length-prefixed JSON frames over TCP, HMAC handshake.

A frame is a 4-byte big-endian length and that many bytes of UTF-8 JSON (one object).
Handshake, initiated by the agent (it connects; it reconnects after a blip):

    controller -> {"type": "challenge", "nonce": HEX}
    agent      -> {"type": "hello", "node": NAME, "mac": HMAC-SHA256(token, nonce|node), ...}
    controller -> {"type": "welcome"} | {"type": "denied", "why": TEXT} (then closes)

The token never travels: a listener that is not the controller learns nothing from a
hello, and a connection that does not know the job's token is refused.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import secrets
import socket
import struct
import threading
from pathlib import Path
from typing import Any

MAX_FRAME = 64 << 20
_HEADER = struct.Struct(">I")


class WireError(ConnectionError):
    """The peer closed, sent garbage, or failed the handshake."""


def new_token() -> str:
    return secrets.token_hex(32)


def write_token(path: Path, token: str) -> None:
    """The job's token, readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.touch(mode=0o600)
    tmp.write_text(token, encoding="ascii")
    tmp.replace(path)


def read_token(path: Path) -> str:
    try:
        token = path.read_text(encoding="ascii").strip()
    except OSError as e:
        raise WireError(f"cannot read the job token {path} ({e.strerror}). Fix: the agent "
                        "needs the job dir the controller wrote (a shared file system)") from e
    if len(token) < 32:
        raise WireError(f"the job token in {path} is too short; the file is damaged")
    return token


def mac(token: str, nonce: str, node: str) -> str:
    return hmac.new(token.encode(), f"{nonce}|{node}".encode(), hashlib.sha256).hexdigest()


def check_mac(token: str, nonce: str, node: str, got: object) -> bool:
    return isinstance(got, str) and hmac.compare_digest(mac(token, nonce, node), got)


class Conn:
    """One framed connection; send is thread-safe, recv belongs to one reader."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._send_lock = threading.Lock()
        self.peer = _peer(sock)

    def send(self, msg: dict[str, Any]) -> None:
        data = json.dumps(msg, separators=(",", ":")).encode()
        if len(data) > MAX_FRAME:
            raise WireError(f"frame of {len(data)} bytes is over the {MAX_FRAME} limit")
        with self._send_lock:
            try:
                self.sock.sendall(_HEADER.pack(len(data)) + data)
            except OSError as e:
                raise WireError(f"send to {self.peer} failed: {e}") from e

    def recv(self, timeout: float | None = None) -> dict[str, Any]:
        """The next frame; socket.timeout when none came within `timeout`."""
        self.sock.settimeout(None if timeout is None else max(timeout, 0.001))
        header = self._exact(_HEADER.size, first=True)
        (size,) = _HEADER.unpack(header)
        if size > MAX_FRAME:
            raise WireError(f"{self.peer} announced a {size}-byte frame (limit {MAX_FRAME})")
        self.sock.settimeout(max(timeout or 0, 30.0))  # the rest of a started frame comes soon
        body = self._exact(size, first=False)
        try:
            msg = json.loads(body)
        except ValueError as e:
            raise WireError(f"{self.peer} sent a frame that is not JSON") from e
        if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
            raise WireError(f"{self.peer} sent a frame without a type")
        return msg

    def _exact(self, n: int, first: bool) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            try:
                chunk = self.sock.recv(n - len(buf))
            except TimeoutError:
                if first and not buf:
                    raise
                raise WireError(f"{self.peer} stopped in the middle of a frame") from None
            except OSError as e:
                raise WireError(f"connection to {self.peer} broke: {e}") from e
            if not chunk:
                raise WireError(f"{self.peer} closed the connection")
            buf += chunk
        return bytes(buf)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


def _peer(sock: socket.socket) -> str:
    try:
        host, port = sock.getpeername()[:2]
        return f"{host}:{port}"
    except OSError:
        return "?"


def connect(host: str, port: int, token: str, node: str, hello: dict[str, Any],
            timeout: float = 5.0) -> Conn:
    """Connect to the controller and pass its challenge; WireError when refused."""
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as e:
        raise WireError(f"cannot reach the controller at {host}:{port}: {e}") from e
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn = Conn(sock)
    try:
        challenge = conn.recv(timeout)
        if challenge.get("type") != "challenge" or not isinstance(challenge.get("nonce"), str):
            raise WireError(f"{host}:{port} is not a trainguard controller")
        conn.send({**hello, "type": "hello", "node": node,
                   "mac": mac(token, challenge["nonce"], node)})
        answer = conn.recv(timeout)
    except (TimeoutError, WireError) as e:
        conn.close()
        raise WireError(f"handshake with {host}:{port} failed: {e}") from e
    if answer.get("type") != "welcome":
        conn.close()
        raise WireError(f"the controller refused node {node}: {answer.get('why', answer)}")
    return conn


def accept(conn: Conn, token: str, timeout: float = 5.0) -> dict[str, Any]:
    """The controller's side of the handshake: the agent's hello, or WireError."""
    nonce = secrets.token_hex(16)
    try:
        conn.send({"type": "challenge", "nonce": nonce})
        hello = conn.recv(timeout)
    except (TimeoutError, WireError) as e:
        raise WireError(f"{conn.peer} did not say hello: {e}") from e
    node = hello.get("node")
    if hello.get("type") != "hello" or not isinstance(node, str) or not node:
        raise WireError(f"{conn.peer} sent no node name")
    if not check_mac(token, nonce, node, hello.get("mac")):
        with contextlib.suppress(WireError):
            conn.send({"type": "denied", "why": "wrong job token"})
        raise WireError(f"{conn.peer} (node {node!r}) does not know the job token")
    return hello

