"""A rank's end of the control channel: its agent's verdicts, out of band. Stdlib only.

The agent sends datagrams into the rank's inbox, a socket pair whose other end the rank
handed it over the worker channel (Inbox); this process makes it once, on first use, and
StepGuard (worker/step.py) and run_resilient
(worker/resilient.py) both read it through the one Inbox. A verdict that the reader waiting
now does not take is kept for the next (a RESTART that comes while a StepGuard waits for
its step's REFORM is run_resilient's), up to KEEP of them.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from trainguard.worker import channel
from trainguard.worker.contract import (
    ENV_PG_GENERATION,
    ENV_RANK,
    ENV_SOCKET,
    ControlKind,
    MessageKind,
    control_socket,
    parse_control,
)
from trainguard.worker.fields import ContractError

KEEP = 64
# a stop signal came that a handler only recorded (the on-exit save's, which saves at the next
# step boundary): a rank waiting for a verdict on a failed step stops waiting, since no verdict
# comes to a rank being stopped and no step boundary comes while it waits
STOPPING = threading.Event()
MAX_ERROR_CHARS = 4_000  # of an error sent in a report
Verdict = dict[str, Any]


class RestartRequested(BaseException):
    """The launcher restarts this rank in place: leave the training function for
    run_resilient, which re-enters it. A BaseException, so `except Exception` lets it by."""

    def __init__(self, verdict: Verdict) -> None:
        super().__init__(f"in-process restart on process group generation "
                         f"{verdict.get('generation')}")
        self.verdict = verdict


class Inbox:
    """`name` (contract.control_socket) says which rank and which verdicts; no socket has
    it. The inbox is one end of a socket pair; `hand_over` gives the other end to whoever
    sends the verdicts (default: the agent, through the worker channel) and it is closed
    here, so nobody else can send into it, nor take the place of it (walk-through 32 #4:
    an abstract name, bound again by each new process of a rank, could be bound first by
    another user, who then got the rank's verdicts while the rank had none). Raises
    OSError when the end cannot be handed over."""

    def __init__(self, name: str,
                 hand_over: Callable[[str, socket.socket], bool] | None = None) -> None:
        self.name = name
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:  # the kernel's credentials of each sender: another user's verdicts are dropped
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            if not (hand_over or channel.hand_over)(name, theirs):
                raise OSError(errno.ENOTCONN, "the agent's channel did not take it")
        except OSError:
            self._sock.close()
            raise
        finally:
            theirs.close()
        self._kept: list[Verdict] = []

    def wait(self, accept: Callable[[Verdict], bool], timeout_s: float,
             tick: Callable[[], object] | None = None) -> Verdict | None:
        """The first verdict (kept or arriving) that `accept` takes, or None after
        `timeout_s` or once STOPPING is set; `tick` runs first and then every second (a
        report sent again)."""
        for i, kept in enumerate(self._kept):
            if accept(kept):
                return self._kept.pop(i)
        deadline = time.monotonic() + timeout_s
        next_tick = 0.0
        while (left := deadline - time.monotonic()) > 0 and not STOPPING.is_set():
            if tick is not None and time.monotonic() >= next_tick:
                tick()
                next_tick = time.monotonic() + 1.0
            self._sock.settimeout(min(left, 0.25))
            try:
                v = self._receive()
            except TimeoutError:
                continue
            if v is not None and accept(v):
                return v
            self._keep(v)
        return None

    def take(self, accept: Callable[[Verdict], bool]) -> Verdict | None:
        """A verdict `accept` takes that is here already (kept, or queued on the socket),
        without waiting."""
        found = self.wait(accept, 0.0)
        self._sock.setblocking(False)  # wait() sets its own timeout again
        while found is None:
            try:
                v = self._receive()
            except (BlockingIOError, InterruptedError):
                return None
            if v is not None and accept(v):
                return v
            self._keep(v)
        return found

    def _receive(self) -> Verdict | None:
        """The next datagram as a verdict; None for one that is not (another user's, not
        JSON, not in the contract): it is ignored."""
        data, anc, _, _ = self._sock.recvmsg(65536, socket.CMSG_SPACE(_UCRED.size))
        if not _same_user(anc):
            return None
        try:
            return parse_control(json.loads(data))
        except (ValueError, ContractError, RecursionError):
            return None

    def _keep(self, v: Verdict | None) -> None:
        if v is not None:
            self._kept = ([*self._kept, v])[-KEEP:]

    def close(self) -> None:
        self._sock.close()


_UCRED = struct.Struct("3i")  # pid, uid, gid


def _same_user(ancillary: list[tuple[int, int, bytes]]) -> bool:
    """The datagram's sender (SCM_CREDENTIALS, filled in by the kernel) is this user."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS \
                and len(data) >= _UCRED.size:
            uid: int = _UCRED.unpack(data[:_UCRED.size])[1]
            return uid == os.getuid()
    return False


_inbox: Inbox | None = None
_failed = False


def inbox() -> Inbox | None:
    """This process's inbox, made on the first call; None outside the launcher (no agent
    channel, no RANK) or when the agent could not be handed its end (said on stderr)."""
    global _inbox, _failed
    if _inbox is not None or _failed:
        return _inbox
    rank = os.environ.get(ENV_RANK, "")
    if not channel.available() or not rank.isdigit():
        return None
    name = control_socket(os.environ[ENV_SOCKET], int(rank))
    try:
        _inbox = Inbox(name)
    except OSError as e:
        _failed = True
        unreachable("control", "step re-execution, in-process restart", "no verdict reaches it "
                    "(step re-execution and in-process restart are off in it)", e)
    return _inbox


def unreachable(who: str, off: str, effect: str, e: OSError) -> None:
    """An inbox that could not be handed over: said on the rank's console (`effect`), and to
    the agent (a ControlUnreachable event naming what is `off`, a list of features) through
    the channel, which may still work (an fd limit reached after the channel's socket was
    made; walk-through 32's leftover)."""
    say(who, f"WARNING: cannot hand the agent a way to reach this process ({e}): {effect}")
    channel.send(MessageKind.CONTROL_UNREACHABLE, off=off, error=str(e))


# -- what StepGuard and run_resilient share ----------------------------------------------------

def env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


def newer_restart(v: dict[str, Any], generation: int) -> bool:
    """Whether `v` is the launcher's RESTART onto a process group newer than `generation`
    (an older one's RESTART was for a failure this process already restarted after)."""
    return bool(v["kind"] == ControlKind.RESTART and v["generation"] > generation)


def pg_generation() -> int:
    """The process group generation this process joins: 0, or the one an in-process restart
    handed out (TRAINGUARD_PG_GENERATION)."""
    return int(env_float(ENV_PG_GENERATION, 0))


def error_text(e: BaseException) -> tuple[str, str]:
    """An error as a report carries it (bounded), and its first line for a log line."""
    text = f"{type(e).__name__}: {e}"[:MAX_ERROR_CHARS]
    return text, (text.splitlines() or [""])[0]


def say(who: str, line: str) -> None:
    """A line on the rank's stderr (its log): `[trainguard.WHO] rank R: line`."""
    rank = os.environ.get(ENV_RANK, "?")
    print(f"[trainguard.{who}] rank {rank}: {line}", file=sys.stderr, flush=True)
