"""The launcher's console (and a node agent's): writes that never wait for the reader.

The controller's event lines and the ranks' echoed lines used to be written where they were
made: a console that stopped reading without closing (a terminal paused with Ctrl-S, a pipe
whose reader stalled, an ssh session gone quiet) filled its 64 KiB pipe and then stopped the
controller's loop and the thread that reads the ranks' pipes, so the ranks blocked on their
own prints and the job stood still. Now a write only queues the text; one thread per stream
writes it out. Past LIMIT_BYTES queued, lines are dropped and counted, and the console says
how many, and where, when it reads again: the job dir keeps every rank's log and every event anyway.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Protocol, TextIO

from trainguard.records import Event

LIMIT_BYTES = 1 << 20  # queued for a console that does not read: then lines are dropped
CLOSE_WAIT_S = 10.0  # at exit, how long the last lines wait for a console that does not read


class Writable(Protocol):
    def write(self, text: str, /) -> int: ...
    def flush(self) -> None: ...


class _Dropped:
    """Lines dropped at this place in the queue: written as one notice."""

    def __init__(self, lines: int) -> None:
        self.lines = lines

    def __str__(self) -> str:
        return (f"[trainguard] {self.lines} console line(s) dropped: the console was not "
                "reading (every rank's log and every event are in the job dir)\n")


class Console:
    """A stream whose write() queues and returns at once; a thread writes what is queued."""

    def __init__(self, stream: TextIO, limit_bytes: int = LIMIT_BYTES) -> None:
        self._stream, self._limit = stream, limit_bytes
        self._fd = _fd_of(stream)  # written with os.write: no buffer lock held while blocked
        self._queue: deque[str | _Dropped] = deque()
        self._queued = 0  # bytes queued (a notice of dropped lines counts none)
        self._closed = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="trainguard-console",
                                        daemon=True)
        self._thread.start()

    def write(self, text: str) -> int:
        with self._cond:
            if self._closed:
                return 0
            if self._queued + len(text) <= self._limit:
                self._queue.append(text)
                self._queued += len(text)
            elif self._queue and isinstance(self._queue[-1], _Dropped):
                self._queue[-1].lines += max(text.count("\n"), 1)
            else:  # the notice stands where lines were dropped (a shorter line after them
                self._queue.append(_Dropped(max(text.count("\n"), 1)))  # may still fit)
            self._cond.notify()
        return len(text)

    def flush(self) -> None:
        """Nothing to do: the writer thread flushes after each batch."""

    def close(self, timeout: float = CLOSE_WAIT_S) -> None:
        """Write out what is queued (up to `timeout` for a console that does not read)."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return  # closed, and all written
                items = list(self._queue)
                self._queue.clear()
                self._queued = 0
            self._out("".join(str(i) for i in items))

    def _out(self, text: str) -> None:
        with contextlib.suppress(OSError, ValueError):  # a console that went away: dropped
            if self._fd is None:
                self._stream.write(text)
                self._stream.flush()
                return
            data = text.encode("utf-8", "replace")
            while data:
                data = data[os.write(self._fd, data):]


def _fd_of(stream: TextIO) -> int | None:
    """The stream's file descriptor, its buffer flushed first; None for one without (a test's
    StringIO), which is then written through its own write()."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):
        return None
    with contextlib.suppress(OSError, ValueError):
        stream.flush()
    return fd


@contextlib.contextmanager
def consoles() -> Iterator[tuple[Console, Console]]:
    """This process's stdout and stderr as Consoles (one writer when both are the same file,
    so lines of the two never interleave mid-line), written out on the way out within one
    CLOSE_WAIT_S. The logging handlers that wrote to either write to them meanwhile (a
    warning from the thread that reads the agents' links must not wait for the console)."""
    out = Console(sys.stdout)
    err = out if _same_file(sys.stdout, sys.stderr) else Console(sys.stderr)
    moved = [(h, h.stream) for h in logging.getLogger().handlers
             if isinstance(h, logging.StreamHandler) and h.stream in (sys.stdout, sys.stderr)]
    for h, stream in moved:
        h.setStream(out if stream is sys.stdout else err)
    try:
        yield out, err
    finally:
        for h, stream in moved:
            h.setStream(stream)
        deadline = time.monotonic() + CLOSE_WAIT_S
        for c in {id(out): out, id(err): err}.values():
            c.close(max(deadline - time.monotonic(), 0.0))


def _same_file(a: TextIO, b: TextIO) -> bool:
    try:
        return os.path.samestat(os.fstat(a.fileno()), os.fstat(b.fileno()))
    except (OSError, ValueError, AttributeError):
        return False


def console_printer(stream: Writable = sys.stderr) -> Callable[[Event], None]:
    """Supervisor-style, greppable launcher lines: `[trainguard] HH:MM:SS Level Reason: msg`.

    A console that went away (a closed pipe) never stops the job: lines are then dropped.
    """

    def show(ev: Event) -> None:
        t = ev.time.astimezone().strftime("%H:%M:%S")
        with contextlib.suppress(OSError, ValueError):  # one write: the line and its end
            stream.write(f"[trainguard] {t} {ev.level.value} {ev.reason}: {ev.message}\n")
            stream.flush()  # (print's two writes let a rank's line in between, unbuffered)

    return show
