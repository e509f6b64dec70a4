"""Controller <-> node agent wire: length-prefixed frames over TCP, every frame after the
handshake (handshake.py) authenticated; the job token's file.

A frame is a 4-byte big-endian length and that many bytes: plain JSON during the handshake,
then `MAC(32) | seq(8) | JSON`: MAC = HMAC-SHA256(key, direction | seq | JSON) with the
connection's key from the handshake, seq counting from 0 in each direction. A frame with a
wrong MAC, a sequence number out of order (a replay, a dropped or injected frame) or one
reflected back is refused (FrameRejected) and the connection ends; the agent reconnects with
fresh nonces.
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

MAX_FRAME = 64 << 20
SEND_TIMEOUT_S = 30.0  # a peer that takes no bytes for this long is gone
_HEADER = struct.Struct(">I")
_SEQ = struct.Struct(">Q")
_MAC_LEN = 32
_SEAL_LEN = _MAC_LEN + _SEQ.size
_TO_AGENT, _TO_CONTROLLER = b"A", b"C"  # a frame reflected back to its sender fails


class WireError(ConnectionError):
    """The peer closed, sent garbage, or failed the handshake."""


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
        st = path.stat()
        mode, owner = st.st_mode, st.st_uid
        token = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) else "not ASCII"
        raise WireError(f"cannot read the job token {path} ({why}). Fix: the agent "
                        "needs the job dir the controller wrote (a shared file system)") from e
    if owner != os.geteuid():
        raise WireError(f"the job token {path} belongs to uid {owner}, not to this process's "
                        f"user (uid {os.geteuid()}). Fix: run the job's launcher and agents "
                        "as one user, in a job dir of its own")
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
                try:  # closed under us (Hub.close): ValueError for its fd -1, as in recv
                    ready = left > 0 and readable(self.sock, left)
                except (OSError, ValueError) as e:
                    raise WireError(f"connection to {self.peer} is closed: {e}") from e
                if not ready:
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


def out_of_fds(e: OSError) -> bool:
    """accept() failed for want of a resource that comes back (fds, buffers, memory)."""
    return e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
