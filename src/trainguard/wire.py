"""Controller <-> node agent wire: length-prefixed JSON frames over TCP, HMAC handshake.

A frame is a 4-byte big-endian length and that many bytes of UTF-8 JSON (one object).
Handshake, initiated by the agent (it connects; it reconnects after a blip):

    controller -> {"type": "challenge", "nonce": HEX}
    agent      -> {"type": "hello", "node": NAME, "mac": HMAC-SHA256(token, nonce|node),
                   "nonce": HEX2, "addr": its address, ...}
    controller -> {"type": "welcome", "mac": HMAC-SHA256(token, HEX2|controller:NAME)}
                  | {"type": "denied", "why": TEXT} (then closes)

Both sides prove they know the job's token, which never travels: an agent obeys only the
controller of its job (a process that took the controller's port after it died gets no
command run), and a connection that does not know the token is refused. Frames before the
handshake is done are at most 1 MiB.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import secrets
import select
import socket
import struct
import threading
from pathlib import Path
from typing import Any

MAX_FRAME = 64 << 20
MAX_HANDSHAKE_FRAME = 1 << 20
SEND_TIMEOUT_S = 30.0  # a peer that takes no bytes for this long is gone
_HEADER = struct.Struct(">I")


class WireError(ConnectionError):
    """The peer closed, sent garbage, or failed the handshake."""


class Superseded(WireError):
    """The controller has another agent for this node: this one must end."""


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
        # one fixed timeout for sends and for the rest of a started frame; waiting for the
        # next frame uses select(), so the reader's short waits never shorten a send
        sock.settimeout(SEND_TIMEOUT_S)
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

    def recv(self, timeout: float | None = None, limit: int = MAX_FRAME) -> dict[str, Any]:
        """The next frame; TimeoutError when none began within `timeout` (None: wait)."""
        try:
            ready, _, _ = select.select([self.sock], [], [], timeout)
        except (OSError, ValueError) as e:
            raise WireError(f"connection to {self.peer} is closed: {e}") from e
        if not ready:
            raise TimeoutError
        header = self._exact(_HEADER.size)
        (size,) = _HEADER.unpack(header)
        if size > limit:
            raise WireError(f"{self.peer} announced a {size}-byte frame (limit {limit})")
        body = self._exact(size)
        try:
            msg = json.loads(body)
        except ValueError as e:
            raise WireError(f"{self.peer} sent a frame that is not JSON") from e
        if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
            raise WireError(f"{self.peer} sent a frame without a type")
        return msg

    def _exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            try:
                chunk = self.sock.recv(n - len(buf))
            except TimeoutError:
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


def keepalive(sock: socket.socket) -> None:
    """Let the kernel notice a peer that vanished (power cut) within about a minute."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for opt, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 6),
                       ("TCP_USER_TIMEOUT", 60_000)):
        if hasattr(socket, opt):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)


def connect(host: str, port: int, token: str, node: str, hello: dict[str, Any],
            timeout: float = 5.0) -> Conn:
    """Connect to the controller, pass its challenge and check that it knows the job's
    token too; WireError when refused or when the peer is not the job's controller."""
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as e:
        raise WireError(f"cannot reach the controller at {host}:{port}: {e}") from e
    keepalive(sock)
    conn = Conn(sock)
    own_nonce = secrets.token_hex(16)
    try:
        challenge = conn.recv(timeout, MAX_HANDSHAKE_FRAME)
        if challenge.get("type") != "challenge" or not isinstance(challenge.get("nonce"), str):
            raise WireError(f"{host}:{port} is not a trainguard controller")
        conn.send({"addr": sock.getsockname()[0], **hello, "type": "hello", "node": node,
                   "mac": mac(token, challenge["nonce"], node), "nonce": own_nonce})
        answer = conn.recv(timeout, MAX_HANDSHAKE_FRAME)
    except (TimeoutError, WireError) as e:
        conn.close()
        raise WireError(f"handshake with {host}:{port} failed: {e}") from e
    if answer.get("type") != "welcome":
        conn.close()
        why = f"the controller refused node {node}: {answer.get('why', answer)}"
        raise Superseded(why) if answer.get("superseded") else WireError(why)
    if not check_mac(token, own_nonce, f"controller:{node}", answer.get("mac")):
        conn.close()
        raise WireError(f"{host}:{port} does not know the job token: not this job's "
                        "controller (another process may have taken its port)")
    return conn


def accept(conn: Conn, token: str, timeout: float = 5.0) -> dict[str, Any]:
    """The controller's side of the handshake: the agent's hello, or WireError. The caller
    answers with welcome(...) or deny(...)."""
    nonce = secrets.token_hex(16)
    try:
        conn.send({"type": "challenge", "nonce": nonce})
        hello = conn.recv(timeout, MAX_HANDSHAKE_FRAME)
    except (TimeoutError, WireError) as e:
        raise WireError(f"{conn.peer} did not say hello: {e}") from e
    node = hello.get("node")
    if hello.get("type") != "hello" or not isinstance(node, str) or not node:
        raise WireError(f"{conn.peer} sent no node name")
    if not check_mac(token, nonce, node, hello.get("mac")):
        with contextlib.suppress(WireError):
            conn.send({"type": "denied", "why": "wrong job token"})
        raise WireError(f"{conn.peer} (node {node!r}) does not know the job token")
    if not isinstance(hello.get("nonce"), str):
        raise WireError(f"{conn.peer} (node {node!r}) sent no nonce")
    return hello


def welcome(conn: Conn, token: str, hello: dict[str, Any]) -> None:
    """The controller's proof that it knows the token too, answering the agent's nonce."""
    conn.send({"type": "welcome",
               "mac": mac(token, str(hello["nonce"]), f"controller:{hello['node']}")})


def deny(conn: Conn, why: str, superseded: bool = False) -> None:
    with contextlib.suppress(WireError):
        conn.send({"type": "denied", "why": why, "superseded": superseded})

