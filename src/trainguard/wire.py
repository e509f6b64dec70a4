"""Controller <-> node agent wire: length-prefixed frames over TCP, HMAC handshake, then
every frame authenticated.

A frame is a 4-byte big-endian length and that many bytes. Handshake (JSON frames, at most
256 KiB, all of it within HANDSHAKE_TIMEOUT_S), initiated by the agent (it connects; it
reconnects after a blip):

    controller -> {"type": "challenge", "nonce": HEX, "version": WIRE_VERSION}
    agent      -> {"type": "hello", "node": NAME, "mac": HMAC-SHA256(token, nonce|node),
                   "nonce": HEX2, "version": WIRE_VERSION, "addr": its address, ...}
    controller -> {"type": "welcome", "mac": HMAC-SHA256(token, HEX2|controller:NAME)}
                  | {"type": "denied", "why": TEXT} (then closes)

Both sides prove they know the job's token, which never travels. After the welcome each
frame is `MAC(32) | seq(8) | JSON`: MAC = HMAC-SHA256(key, direction | seq | JSON) with the
connection's key = HMAC-SHA256(token, "session"|nonce|HEX2|node), seq counting from 0 in
each direction. A frame with a wrong MAC, a sequence number out of order (a replay, a
dropped or injected frame) or one reflected back is refused (FrameRejected) and the
connection ends; the agent reconnects with fresh nonces. A peer of another WIRE_VERSION is
refused at the handshake with both versions named.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import json
import os
import resource
import secrets
import select
import socket
import stat
import struct
import threading
import time
from pathlib import Path
from typing import Any

WIRE_VERSION = 2  # 1: frames after the handshake carried no MAC
MAX_FRAME = 64 << 20
MAX_HANDSHAKE_FRAME = 256 << 10
HANDSHAKE_TIMEOUT_S = 10.0  # the whole handshake, however slowly the bytes come
SEND_TIMEOUT_S = 30.0  # a peer that takes no bytes for this long is gone
_HEADER = struct.Struct(">I")
_SEQ = struct.Struct(">Q")
_MAC_LEN = 32
_SEAL_LEN = _MAC_LEN + _SEQ.size
_TO_AGENT, _TO_CONTROLLER = b"A", b"C"  # a frame reflected back to its sender fails


class WireError(ConnectionError):
    """The peer closed, sent garbage, or failed the handshake."""


class Superseded(WireError):
    """The controller has another agent for this node: this one must end."""


class FrameRejected(WireError):
    """An authenticated connection carried a frame that failed its MAC or sequence check:
    injected, replayed, relayed from another connection, or damaged."""


def new_token() -> str:
    return secrets.token_hex(32)


def write_token(path: Path, token: str) -> None:
    """The job's token, readable by its owner only: created 0600 (never through a symlink,
    never reusing a stale temporary file's mode), synced, then renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, token.encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    tmp.replace(path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def read_token(path: Path) -> str:
    try:
        mode = path.stat().st_mode
        token = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) else "not ASCII"
        raise WireError(f"cannot read the job token {path} ({why}). Fix: the agent "
                        "needs the job dir the controller wrote (a shared file system)") from e
    if mode & 0o077:
        raise WireError(f"the job token {path} is readable by others (mode "
                        f"{stat.S_IMODE(mode):o}). Fix: chmod 600 {path}")
    if len(token) < 32:
        raise WireError(f"the job token in {path} is too short; the file is damaged")
    return token


def raise_fd_limit() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (a controller holds one fd
    per agent); the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < want:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            return want
    return soft


def mac(token: str, nonce: str, node: str) -> str:
    return hmac.new(token.encode(), f"{nonce}|{node}".encode(), hashlib.sha256).hexdigest()


def check_mac(token: str, nonce: str, node: str, got: object) -> bool:
    return (isinstance(got, str) and got.isascii()  # compare_digest refuses other text
            and hmac.compare_digest(mac(token, nonce, node), got))


def session_key(token: str, controller_nonce: str, agent_nonce: str, node: str) -> bytes:
    return hmac.new(token.encode(), f"session|{controller_nonce}|{agent_nonce}|{node}".encode(),
                    hashlib.sha256).digest()


def readable(sock: socket.socket, timeout: float | None) -> bool:
    """poll(), not select(): any fd number (select() fails on fds >= 1024)."""
    p = select.poll()
    p.register(sock, select.POLLIN | select.POLLPRI)
    ms = -1 if timeout is None else max(int(timeout * 1000), 0)
    return bool(p.poll(ms))


class Conn:
    """One framed connection; send is thread-safe, recv belongs to one reader. Plain JSON
    frames until secure() is called (the handshake), authenticated frames after."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        # one fixed timeout for sends and for the rest of a started frame; waiting for the
        # next frame uses poll(), so the reader's short waits never shorten a send
        sock.settimeout(SEND_TIMEOUT_S)
        self._send_lock = threading.Lock()
        self.peer = _peer(sock)
        self._key: bytes | None = None
        self._out_dir, self._in_dir = b"", b""
        self._out_seq = self._in_seq = 0
        self._buf = bytearray()  # feed(): bytes of a frame not complete yet

    def secure(self, key: bytes, controller_side: bool) -> None:
        """From now on every frame carries a MAC under `key` and a sequence number."""
        with self._send_lock:
            self._key = key
            self._out_dir, self._in_dir = ((_TO_AGENT, _TO_CONTROLLER) if controller_side
                                           else (_TO_CONTROLLER, _TO_AGENT))
            self._out_seq = self._in_seq = 0

    @staticmethod
    def _tag(key: bytes, direction: bytes, seq: bytes, data: bytes) -> bytes:
        return hmac.new(key, direction + seq + data, hashlib.sha256).digest()

    def send(self, msg: dict[str, Any]) -> None:
        data = json.dumps(msg, separators=(",", ":")).encode()
        if len(data) + _SEAL_LEN > MAX_FRAME:
            raise WireError(f"frame of {len(data)} bytes is over the {MAX_FRAME} limit")
        with self._send_lock:
            if self._key is not None:
                seq = _SEQ.pack(self._out_seq)
                data = self._tag(self._key, self._out_dir, seq, data) + seq + data
                self._out_seq += 1
            try:
                self.sock.sendall(_HEADER.pack(len(data)) + data)
            except OSError as e:
                raise WireError(f"send to {self.peer} failed: {e}") from e

    def recv(self, timeout: float | None = None, limit: int = MAX_FRAME,
             deadline: float | None = None) -> dict[str, Any]:
        """The next frame; TimeoutError when none began within `timeout` (None: wait).
        `deadline` (monotonic): the whole frame must have come by then (the handshake)."""
        try:
            ready = readable(self.sock, timeout)
        except (OSError, ValueError) as e:
            raise WireError(f"connection to {self.peer} is closed: {e}") from e
        if not ready:
            raise TimeoutError
        header = self._exact(_HEADER.size, deadline)
        (size,) = _HEADER.unpack(header)
        if size > limit:
            raise WireError(f"{self.peer} announced a {size}-byte frame (limit {limit})")
        return self._parse(self._open(self._exact(size, deadline)))

    def feed(self, data: bytes, limit: int = MAX_FRAME) -> list[dict[str, Any]]:
        """The frames that `data` (bytes a selector read from the socket) completes; the
        rest waits for the next call. The same checks as recv()."""
        self._buf += data
        out: list[dict[str, Any]] = []
        while len(self._buf) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self._buf)
            if size > limit:
                raise WireError(f"{self.peer} announced a {size}-byte frame (limit {limit})")
            end = _HEADER.size + size
            if len(self._buf) < end:
                break
            body = bytes(self._buf[_HEADER.size:end])
            del self._buf[:end]
            out.append(self._parse(self._open(body)))
        return out

    def _parse(self, body: bytes) -> dict[str, Any]:
        try:
            msg = json.loads(body)
        except (ValueError, RecursionError) as e:
            raise WireError(f"{self.peer} sent a frame that is not JSON (or nested too "
                            "deep)") from e
        if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
            raise WireError(f"{self.peer} sent a frame without a type")
        return msg

    def _open(self, body: bytes) -> bytes:
        """The JSON of an authenticated frame, or FrameRejected."""
        if self._key is None:
            return body
        if len(body) < _SEAL_LEN:
            raise FrameRejected(f"{self.peer} sent an unauthenticated frame")
        tag, seq, data = body[:_MAC_LEN], body[_MAC_LEN:_SEAL_LEN], body[_SEAL_LEN:]
        if not hmac.compare_digest(tag, self._tag(self._key, self._in_dir, seq, data)):
            raise FrameRejected(f"{self.peer} sent a frame with a wrong MAC (injected, "
                                "relayed from another connection, or damaged)")
        (n,) = _SEQ.unpack(seq)
        if n != self._in_seq:
            raise FrameRejected(f"{self.peer} sent frame {n} where {self._in_seq} was due "
                                "(a replayed or dropped frame)")
        self._in_seq += 1
        return data

    def _exact(self, n: int, deadline: float | None = None) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0 or not readable(self.sock, left):
                    raise WireError(f"{self.peer} sent too slowly (handshake deadline)")
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

    def shutdown(self) -> None:
        """End the connection but keep its fd: the thread that reads it sees the end and
        closes it (closing an fd a selector watches would lose that event)."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.shutdown()
        self.sock.close()


def _peer(sock: socket.socket) -> str:
    try:
        host, port = sock.getpeername()[:2]
        return f"{host}:{port}"
    except OSError:
        return "?"


def keepalive(sock: socket.socket) -> None:
    """Let the kernel notice a peer that vanished (power cut) within about a minute."""
    with contextlib.suppress(OSError):
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
    deadline = time.monotonic() + HANDSHAKE_TIMEOUT_S
    try:
        challenge = conn.recv(timeout, MAX_HANDSHAKE_FRAME, deadline)
        nonce = challenge.get("nonce")
        if challenge.get("type") != "challenge" or not isinstance(nonce, str):
            raise WireError(f"{host}:{port} is not a trainguard controller")
        if challenge.get("version") != WIRE_VERSION:
            raise WireError(f"{host}:{port} speaks wire version {challenge.get('version', 1)}, "
                            f"this agent {WIRE_VERSION}: run one trainguard on every node")
        conn.send({"addr": sock.getsockname()[0], **hello, "type": "hello", "node": node,
                   "mac": mac(token, nonce, node), "nonce": own_nonce,
                   "version": WIRE_VERSION})
        answer = conn.recv(timeout, MAX_HANDSHAKE_FRAME, deadline)
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
    conn.secure(session_key(token, nonce, own_nonce, node), controller_side=False)
    return conn


def accept(conn: Conn, token: str, timeout: float | None = None) -> dict[str, Any]:
    """The controller's side of the handshake: the agent's hello (its "challenge" key: the
    nonce sent), or WireError. The whole hello must come within `timeout` (default
    HANDSHAKE_TIMEOUT_S). The caller answers with welcome(...) or deny(...)."""
    timeout = HANDSHAKE_TIMEOUT_S if timeout is None else timeout
    nonce = secrets.token_hex(16)
    deadline = time.monotonic() + timeout
    try:
        conn.send({"type": "challenge", "nonce": nonce, "version": WIRE_VERSION})
        hello = conn.recv(timeout, MAX_HANDSHAKE_FRAME, deadline)
    except (TimeoutError, WireError) as e:  # a TimeoutError has no text of its own
        why = str(e) or f"nothing within {timeout:g}s"
        raise WireError(f"{conn.peer} did not say hello: {why}") from e
    node = hello.get("node")
    if hello.get("type") != "hello" or not isinstance(node, str) or not node:
        raise WireError(f"{conn.peer} sent no node name")
    if hello.get("version") != WIRE_VERSION:
        why = (f"agent speaks wire version {hello.get('version', 1)}, the controller "
               f"{WIRE_VERSION}: run one trainguard on every node")
        deny(conn, why)
        raise WireError(f"{conn.peer} (node {node!r}): {why}")
    if not check_mac(token, nonce, node, hello.get("mac")):
        deny(conn, "wrong job token")
        raise WireError(f"{conn.peer} (node {node!r}) does not know the job token")
    if not isinstance(hello.get("nonce"), str):
        raise WireError(f"{conn.peer} (node {node!r}) sent no nonce")
    return {**hello, "challenge": nonce}


def welcome(conn: Conn, token: str, hello: dict[str, Any]) -> None:
    """The controller's proof that it knows the token too, answering the agent's nonce;
    every frame after it is authenticated."""
    node = str(hello["node"])
    conn.send({"type": "welcome", "mac": mac(token, str(hello["nonce"]), f"controller:{node}")})
    conn.secure(session_key(token, str(hello["challenge"]), str(hello["nonce"]), node),
                controller_side=True)


def deny(conn: Conn, why: str, superseded: bool = False) -> None:
    with contextlib.suppress(WireError):
        conn.send({"type": "denied", "why": why, "superseded": superseded})


def out_of_fds(e: OSError) -> bool:
    """accept() failed for want of a resource that comes back (fds, buffers, memory)."""
    return e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
