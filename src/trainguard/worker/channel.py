"""Messages from a worker to its node agent: JSON datagrams on a Unix socket.

The agent names the socket in TRAINGUARD_AGENT_SOCKET (an abstract name, `@...`). Sending
never fails the training script: without a launcher, or when the agent is gone, a message
is dropped at once. When the agent's queue is full (Linux keeps 10 datagrams a socket,
net.unix.max_dgram_qlen, and a busy node may read them late), a message the next one does
not supersede (a resume, a save, a phase's begin or end, a step's verdict) is tried again
for up to RETRY_S; progress and metrics are dropped, their next one says more. The message
kinds and their fields are in trainguard.worker.contract, which the agent checks each
datagram against. Standard library only.
"""

from __future__ import annotations

import array
import json
import os
import socket
import threading
import time
from typing import Any

from trainguard.worker.contract import ENV_RANK, ENV_SOCKET, MAX_DATAGRAM_BYTES, MessageKind

__all__ = ["ENV_SOCKET", "available", "send"]

RETRY_S = 1.0  # how long a full queue is tried again for a message the next one does not
RETRY_EVERY_S = 0.005  # supersede
# superseded by the next one: dropped when the queue is full, never sent up again (node/outbox.py)
LOSSY_KINDS = frozenset({MessageKind.PROGRESS, MessageKind.TRAIN_METRICS,
                         MessageKind.SNAPSHOT_TAKEN})
# not a message of the contract: a rank handing its agent the way to its control inbox (an
# fd passed with SCM_RIGHTS), taken by the agent's channel itself (node/channel.py)
HAND_OVER = "control_hand_over"

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
    msg = {"kind": kind, "rank": _env_int(ENV_RANK), "pid": os.getpid(), "at": time.time(),
           **fields}
    data = json.dumps(msg, default=str).encode()
    if len(data) > MAX_DATAGRAM_BYTES:
        return False
    return _send(data, kind in LOSSY_KINDS)


def hand_over(name: str, end: socket.socket) -> bool:
    """Hand the agent `end`, the agent's side of a socket pair whose other side is this
    rank's control inbox `name` (contract.control_socket: which rank, which verdicts):
    the agent sends that rank's verdicts into it, never to an abstract name another user
    could bind first (walk-through 32 #4). True once the kernel took it."""
    data = json.dumps({"kind": HAND_OVER, "name": name, "pid": os.getpid()}).encode()
    return _send(data, False, [end.fileno()])


def _send(data: bytes, lossy: bool, fds: list[int] | None = None) -> bool:
    global _sock, _addr
    addr = _address()
    if addr is None:
        return False
    rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())] \
        if fds else []
    with _lock:
        deadline = None
        while True:
            try:
                if _sock is None or _addr != addr:
                    _sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                    _sock.setblocking(False)
                    _addr = addr
                _sock.sendmsg([data], rights, 0, addr)
                return True
            except BlockingIOError:  # the agent's queue is full: it reads late
                now = time.monotonic()
                deadline = now + RETRY_S if deadline is None else deadline
                if lossy or now >= deadline:
                    return False
                time.sleep(RETRY_EVERY_S)
            except OSError:  # no agent there (gone, or not started yet)
                return False


def _env_int(name: str) -> int | None:
    v = os.environ.get(name, "")
    return int(v) if v.lstrip("-").isdigit() else None


def _after_fork_in_child() -> None:
    """A child forked while another thread was sending (a DataLoader worker, forked at every
    epoch) got the lock held, and no thread of its own to release it: its first message (an
    inject_loader's report) blocked forever (review 39 #9). A fresh lock, and a socket of its
    own (the parent's is shared with the child)."""
    global _lock, _sock, _addr
    _lock, _sock, _addr = threading.Lock(), None, None


os.register_at_fork(after_in_child=_after_fork_in_child)

