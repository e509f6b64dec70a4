"""The agent's end of the worker channel: receives workers' JSON datagrams.

Workers send with trainguard.worker.channel.send(); the agent binds an abstract Unix socket
(no file to clean up, no path length limit). A reader thread takes datagrams as they come,
because the kernel queues only a few (net.unix.max_dgram_qlen, 10 by default) and a sender
drops, never blocks, when the queue is full; each poll takes what the thread gathered.
Abstract sockets have no file permissions, so the socket takes the sender's credentials
from the kernel (SO_PASSCRED, SCM_CREDENTIALS) with every datagram and keeps only those the
`admit` policy accepts (default: processes of this user; the agent's: its own workers,
standbys and their descendants, JobProcesses). Each admitted datagram is checked against
the worker contract (worker.contract.parse_message): one that is not JSON, of an unknown
kind, or with a missing, mistyped or out-of-bounds field is dropped. Drops are counted
(`dropped`) and logged as a warning at most every 10 s; none is ever fatal.

The other direction (`tell`): each rank's process hands its agent one end of a socket pair
(SCM_RIGHTS, worker/control.py Inbox), named by contract.control_socket; the agent keeps it
when the hand-over came from a process `admit` accepts and the pair was made by one
(SO_PEERCRED), and sends that rank's verdicts into it. No name is bound, so no other user
can take a rank's place (walk-through 32 #4: the rank's abstract name, derived from this
public one, could be bound first by another user: the rank lost its verdicts, and the
agent sent them to that user).
"""

from __future__ import annotations

import array
import contextlib
import json
import logging
import os
import re
import select
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Container
from typing import Any

from trainguard.worker.channel import HAND_OVER
from trainguard.worker.contract import (
    ControlKind,
    control_socket,
    parse_message,
)
from trainguard.worker.fields import ContractError

log = logging.getLogger(__name__)

MAX_KEPT = 100_000  # messages kept between two drains (the oldest go first)
WARN_EVERY_S = 10.0
_CREDS = struct.Struct("3i")  # struct ucred: pid, uid, gid
MAX_INBOXES = 4_096  # ranks' control inboxes kept (two per rank: verdicts, drains)
# a datagram's credentials and one passed fd (a rank's control inbox); more: MSG_CTRUNC, and
# the kernel closes what did not fit
_ANCILLARY = socket.CMSG_SPACE(_CREDS.size) + socket.CMSG_SPACE(array.array("i").itemsize)

Admit = Callable[[int, int], bool]  # (sender pid, sender uid) -> keep its datagrams?


def same_user(pid: int, uid: int) -> bool:
    return uid == os.getuid()


class JobProcesses:
    """The agent's policy: this user's processes whose session is one of `groups` (each
    worker and standby leads its own session, so their children count too)."""

    def __init__(self, groups: Container[int]) -> None:
        self._groups = groups

    def __call__(self, pid: int, uid: int) -> bool:
        if uid != os.getuid():
            return False
        if pid in self._groups:
            return True
        try:
            return os.getsid(pid) in self._groups
        except OSError:  # gone already
            return False


class ChannelServer:
    def __init__(self, name: str, admit: Admit = same_user,
                 on_message: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.name = name  # `@name` form, as workers get it in contract.ENV_SOCKET
        self._admit = admit
        self._on_message = on_message  # told each valid message as it arrives
        self.dropped = 0  # datagrams dropped: a stranger's, malformed, or out of bounds
        self._warned = 0.0
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self._sock.bind("\0" + name.removeprefix("@"))
        self._sock.setblocking(False)
        self._got: deque[dict[str, Any]] = deque(maxlen=MAX_KEPT)
        # ranks' control inboxes, by contract.control_socket name (handed over by the ranks)
        self._inboxes: dict[str, socket.socket] = {}
        self._inbox_name = re.compile(re.escape(self.name) + r"-rank-\d{1,9}(-drain)?")
        self._lock = threading.Lock()  # every read happens under it: arrival order is kept
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="trainguard-channel",
                                        daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._closed.is_set():
            try:
                p = select.poll()
                p.register(self._sock, select.POLLIN)
                ready = p.poll(200)
            except (OSError, ValueError):  # closed
                return
            if ready:
                with self._lock:
                    self._read_all()

    def _read_all(self) -> None:
        while True:
            try:
                data, anc, flags, _ = self._sock.recvmsg(65536, _ANCILLARY)
            except (BlockingIOError, InterruptedError, OSError):
                return
            fds = passed_fds(anc)  # closed here unless a hand-over takes one
            try:
                self._one(data, anc, flags, fds)
            finally:
                for fd in fds:
                    os.close(fd)

    def _one(self, data: bytes, anc: list[tuple[int, int, bytes]], flags: int,
             fds: list[int]) -> None:
        creds = next((_CREDS.unpack(c[:_CREDS.size]) for level, kind, c in anc
                      if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS
                      and len(c) >= _CREDS.size), None)
        if creds is None or not self._admit(creds[0], creds[1]):
            self._drop("from pid %s uid %s, not a process of this job",
                       *(creds[:2] if creds else ("?", "?")))
            return
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            self._drop("of over 64 KiB (or with more than one fd) from pid %s", creds[0])
            return
        try:
            raw = json.loads(data)
        except (ValueError, RecursionError):  # not JSON (or nested past the parser)
            self._drop("from pid %s: not JSON", creds[0])
            return
        if isinstance(raw, dict) and raw.get("kind") == HAND_OVER:
            self._hand_over(raw.get("name"), fds, creds[0])
            return
        if fds:
            self._drop("from pid %s: an fd with a message", creds[0])
            return
        try:
            msg = parse_message(raw)
        except ContractError as e:
            self._drop("from pid %s: %s", creds[0], e)
            return
        self._got.append(msg)
        if self._on_message is not None:
            self._on_message(msg)

    def _hand_over(self, name: object, fds: list[int], pid: int) -> None:
        """A rank's control inbox, handed over (worker/control.py Inbox): kept under its
        name when the name is one of this agent's ranks' and the socket's other end was
        made by a process of this job (SO_PEERCRED), else dropped."""
        if not isinstance(name, str) or not self._inbox_name.fullmatch(name) or len(fds) != 1:
            self._drop("from pid %s: a control hand-over of %r with %d fd(s)", pid,
                       str(name)[:200], len(fds))
            return
        fd = os.dup(fds[0])
        try:
            sock = socket.socket(fileno=fd)
        except OSError as e:
            os.close(fd)
            self._drop("from pid %s: a control hand-over that is not a socket (%s)", pid, e)
            return
        try:
            peer_pid, peer_uid, _ = _CREDS.unpack(
                sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDS.size))
        except OSError:
            peer_pid, peer_uid = 0, -1
        if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_DGRAM or \
                not self._admit(peer_pid, peer_uid):
            sock.close()
            self._drop("from pid %s: a control hand-over whose other end is pid %s uid %s, "
                       "not a process of this job", pid, peer_pid, peer_uid)
            return
        sock.setblocking(False)
        old = self._inboxes.pop(name, None)
        if old is not None:  # the rank's previous process
            old.close()
        while len(self._inboxes) >= MAX_INBOXES:
            self._inboxes.pop(next(iter(self._inboxes))).close()
        self._inboxes[name] = sock

    def _drop(self, why: str, *args: object) -> None:
        self.dropped += 1
        text = why % args
        log.debug("dropped a worker message %s", text)
        if time.monotonic() - self._warned > WARN_EVERY_S:
            self._warned = time.monotonic()
            log.warning("%d worker message(s) refused so far; this one %s", self.dropped, text)

    def drain(self, keep: bool = False) -> list[dict[str, Any]]:
        """Every valid message received since the last drain, in arrival order (each as
        contract.parse_message returns it: `kind` a MessageKind); `keep`: read what is
        queued now and keep it for the next drain (before a stopped rank's session is
        forgotten: read after, its last datagrams would be refused, their sender no longer
        one of the job's sessions)."""
        with self._lock:
            self._read_all()
            out = list(self._got)
            if not keep:
                self._got.clear()
        return out

    def close(self) -> None:
        self._closed.set()
        with self._lock, contextlib.suppress(OSError):
            self._sock.close()
            for sock in self._inboxes.values():
                sock.close()
            self._inboxes.clear()
        self._thread.join(timeout=1.0)

    def tell(self, ranks: list[int], msg: dict[str, Any]) -> int:
        """The other direction: one control datagram (worker.contract.ControlKind) to each
        rank (worker/control.py), into the inbox its process handed over (the hand-overs
        sent before now are read first); how many were handed to the kernel (a rank that
        handed none, or whose process is gone: not)."""
        data = json.dumps(msg).encode()
        kind = ControlKind.DRAIN if msg.get("kind") == ControlKind.DRAIN.value else None
        told = 0
        with self._lock:
            self._read_all()
            for rank in ranks:
                name = control_socket(self.name, rank, kind)  # a drain: its own inbox
                sock = self._inboxes.get(name)
                if sock is None:
                    log.debug("rank %s: control message not delivered (no inbox)", rank)
                    continue
                try:
                    sock.send(data)
                    told += 1
                except BlockingIOError:  # its queue is full
                    log.debug("rank %s: control message not delivered (queue full)", rank)
                except OSError as e:  # its process is gone
                    log.debug("rank %s: control message not delivered (%s)", rank, e)
                    self._inboxes.pop(name).close()
        return told


def passed_fds(anc: list[tuple[int, int, bytes]]) -> list[int]:
    """The file descriptors a datagram carried (SCM_RIGHTS), now open in this process."""
    fds = array.array("i")
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    return list(fds)
