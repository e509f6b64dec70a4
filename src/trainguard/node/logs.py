"""Per-attempt, per-rank logs: every line stamped with the wall-clock time it was read.

One thread per node reads all workers' pipes (selectors), writes
`LOG_DIR/attempt-N/rank-R.log` (paths.rank_log_path) as `<ISO time> <out|err> <text>`
(worker/contract.py), echoes `[rank R] text` to the console (unless redirected or
filtered) and keeps a bounded tail per rank.
Memory stays bounded however much a rank prints: reads are chunked, over-long lines are
split, tails are fixed-size deques.
"""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import IO

from trainguard.console import Writable
from trainguard.hang.step_lines import CountingLines, bar_groups, pattern_at, step_read
from trainguard.worker.contract import stamp_lines

CHUNK = 64 * 1024
WATCH_LINES = 10_000  # a rank's first lines the step pattern missed are watched
MAX_LINE = 64 * 1024  # longer lines are split into pieces of this size
TAIL_LINES = 200
TAIL_LINE_CHARS = 4096

ProgressCallback = Callable[[int, int, datetime], None]  # (rank, step, seen_at)


@dataclass(frozen=True)
class ConsoleOptions:
    """Which ranks' streams reach the console (torchrun's --redirects / --local-ranks-filter)."""

    redirects: dict[int, int]  # local rank -> 0 none, 1 stdout, 2 stderr, 3 both kept off
    ranks_filter: frozenset[int] | None = None

    @classmethod
    def of(cls, redirects: dict[int, int], ranks_filter: list[int] | None) -> ConsoleOptions:
        """From the job's --redirects and --local-ranks-filter (spec, or an agent's config)."""
        return cls(redirects, frozenset(ranks_filter) if ranks_filter is not None else None)

    def streams(self, rank: int, local_rank: int) -> tuple[bool, bool]:
        if self.ranks_filter is not None and rank not in self.ranks_filter:
            return (False, False)
        r = self.redirects.get(local_rank, self.redirects.get(-1, 0))
        return (not r & 1, not r & 2)


class _Sink:
    """A rank's log file. A failed write (disk full...) stops writing, never reading."""

    def __init__(self, path: Path, errors: list[str]) -> None:
        self.path = path
        self.failed = False
        self._errors = errors
        self._file: IO[str] | None = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", encoding="utf-8", buffering=1 << 16)  # noqa: SIM115
        except OSError as e:
            self._fail(e)

    def _fail(self, e: OSError) -> None:
        self._file = None
        self.failed = True
        self._errors.append(f"cannot write {self.path}: {e.strerror or e}; this rank's output "
                            "is no longer logged to the file (the console and tail still are)")

    def write(self, text: str) -> None:
        if self._file is None:
            return
        try:
            self._file.write(text)
            self._file.flush()  # readable while the job runs, and nothing lost on a kill
        except OSError as e:
            with contextlib.suppress(OSError):
                self._file.close()
            self._fail(e)

    def close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None


class _Stream:
    __slots__ = ("console", "name", "partial", "rank", "sink", "tail")

    def __init__(self, rank: int, name: str, sink: _Sink, tail: deque[str], console: bool):
        self.rank, self.name, self.sink, self.tail, self.console = rank, name, sink, tail, console
        self.partial = b""


class LogRouter:
    """Reads every worker pipe of one attempt until all reach end of file."""

    def __init__(
        self, console: Writable, step_pattern: str, on_progress: ProgressCallback
    ) -> None:
        self._console = console
        self._console_lock = threading.Lock()
        self._step = re.compile(step_pattern)
        self._bars = bar_groups(step_pattern)
        self._labelled: set[int] = set()  # ranks whose steps a labelled line (not a bar) read
        self._on_progress = on_progress
        self._sel = selectors.DefaultSelector()
        self._tails: dict[int, deque[str]] = {}
        self._sinks: dict[int, _Sink] = {}
        self._last_output: dict[int, datetime] = {}
        self._counting: dict[int, CountingLines | None] = {}  # None: its steps are read
        # rank -> a line that counts up but is read as no step, and a pattern that reads it
        self._unread: dict[int, tuple[str, str | None]] = {}
        self._open: dict[int, int] = {}  # rank -> pipes not yet at end of file
        self._eof = threading.Condition()
        self._files: list[_Sink] = []
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._errors: list[str] = []
        self._life = threading.Lock()  # the reader's decision to end, against add()
        self._ended = False  # every pipe reached end of file: the reader ended

    def add(self, rank: int, path: Path, stdout: IO[bytes], stderr: IO[bytes],
            console_streams: tuple[bool, bool]) -> None:
        """Route one worker's pipes: before start(), or while it runs for a rank started
        again in its attempt (an in-process restart; its log file is appended to), also
        once every earlier pipe had ended and the reader with them (every rank failed, then
        restarted in process: the launcher crashed on the closed selector; walk-through 27)."""
        sink = _Sink(path, self._errors)
        self._files.append(sink)
        self._sinks[rank] = sink
        tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._tails[rank] = tail
        with self._life:
            again = self._ended
            if again:
                self._sel, self._ended = selectors.DefaultSelector(), False
            for pipe, name, echo in ((stdout, "out", console_streams[0]),
                                     (stderr, "err", console_streams[1])):
                os.set_blocking(pipe.fileno(), False)
                with self._eof:  # the reader thread may be counting this rank's pipes down
                    self._open[rank] = self._open.get(rank, 0) + 1
                self._sel.register(pipe, selectors.EVENT_READ,
                                   _Stream(rank, name, sink, tail, echo))
        if again:
            self.start()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="trainguard-logs", daemon=True)
        self._thread.start()

    def file_complete(self, rank: int) -> bool:
        """Every line of `rank` reached its log file (no write failed)."""
        return not any(sink.failed for r, sink in self._sinks.items() if r == rank)

    def last_output(self) -> dict[int, datetime]:
        """When each rank last printed a line."""
        with self._lock:
            return dict(self._last_output)

    def unread_steps(self) -> dict[int, tuple[str, str | None]]:
        """Per rank, a line that counts up like steps but that the step pattern does not
        read (hang/step_lines.py), with a --step-pattern that reads it (None: none found)."""
        with self._lock:
            return dict(self._unread)

    def tail(self, rank: int) -> list[str]:
        with self._lock:
            return list(self._tails.get(rank, ()))

    def wait_rank_eof(self, rank: int, timeout: float) -> bool:
        """Wait until a rank's pipes are closed (its last lines are in the tail and file)."""
        with self._eof:
            return self._eof.wait_for(lambda: self._open.get(rank, 0) == 0, timeout)

    def join(self, timeout: float | None = None) -> None:
        """Wait until every pipe reached end of file (all workers and their children exited)."""
        if self._thread is not None:
            self._thread.join(timeout)

    def close(self, timeout: float) -> None:
        """Read until end of file for up to `timeout`, then stop reading and close the files."""
        self.join(timeout)
        self._stop.set()
        self.join(2.0)

    def take_errors(self) -> list[str]:
        with self._lock:
            out, self._errors[:] = list(self._errors), []
        return out

    def _run(self) -> None:
        try:
            while True:
                with self._life:
                    if not self._sel.get_map() or self._stop.is_set():
                        self._ended = True
                        self._close()
                        return
                for key, _ in self._sel.select(timeout=0.5):
                    self._read(key)
        except BaseException:
            with self._life:
                self._ended = True
                self._close()
            raise

    def _read(self, key: selectors.SelectorKey) -> None:
        stream: _Stream = key.data
        pipe: IO[bytes] = key.fileobj  # type: ignore[assignment]
        try:
            data = os.read(pipe.fileno(), CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._sel.unregister(pipe)
            pipe.close()
            if stream.partial:
                self._emit(stream, [stream.partial])
                stream.partial = b""
            with self._eof:
                self._open[stream.rank] -= 1
                self._eof.notify_all()
            return
        # a carriage return ends a line too: progress bars (tqdm) redraw with it
        lines = (stream.partial + data).replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(
            b"\n")
        stream.partial = lines.pop()
        while len(stream.partial) > MAX_LINE:
            lines.append(stream.partial[:MAX_LINE])
            stream.partial = stream.partial[MAX_LINE:]
        if lines:
            self._emit(stream, lines)

    def _emit(self, stream: _Stream, raw: list[bytes]) -> None:
        now = datetime.now(timezone.utc)
        stamp = now.isoformat(timespec="microseconds")
        texts = [b.decode("utf-8", "replace").rstrip("\r") for b in raw]
        stamped = stamp_lines(stamp, stream.name, texts)
        with self._lock:
            self._last_output[stream.rank] = now
            stream.sink.write("\n".join(stamped) + "\n")
            stream.tail.extend(t[:TAIL_LINE_CHARS] for t in stamped)
        if stream.console:
            prefix = f"[rank {stream.rank}] "
            with self._console_lock, contextlib.suppress(OSError, ValueError):
                self._console.write("".join(prefix + t + "\n" for t in texts))
                self._console.flush()
        read = [r for t in texts if (r := self._step_read(t)) is not None]
        if any(not bar for _, bar in read):
            self._labelled.add(stream.rank)
        steps = [int(n) for n, bar in read if not (bar and stream.rank in self._labelled)]
        if not steps:
            self._watch_unread(stream.rank, texts)
        else:
            self._counting[stream.rank] = None  # its steps are read: no need to watch
            self._on_progress(stream.rank, steps[0], now)
            if len(steps) > 1:
                self._on_progress(stream.rank, steps[-1], now)

    def _watch_unread(self, rank: int, texts: list[str]) -> None:
        """Lines the step pattern did not read: do they count up like steps (the first
        WATCH_LINES of a rank whose steps were never read; hang/step_lines.py)?"""
        lines = self._counting.setdefault(rank, CountingLines())
        if lines is None or rank in self._unread or lines.seen >= WATCH_LINES:
            return
        for t in texts:
            at = lines.observe(t)
            if at is not None:
                with self._lock:
                    self._unread[rank] = (t, pattern_at(t, at))
                return

    def step_of(self, text: str) -> str | None:
        """The step a line reports (the pattern's first group that matched), colour codes
        (ANSI escapes, as torchtitan prints) taken off first; None when it reports none."""
        read = self._step_read(text)
        return None if read is None else read[0]

    def _step_read(self, text: str) -> tuple[str, bool] | None:
        """(the step, whether a progress bar's group read it) of a line, or None."""
        return step_read(self._step, self._bars, text)

    def _close(self) -> None:
        with self._eof:
            self._open.clear()
            self._eof.notify_all()
        for key in list(self._sel.get_map().values()):
            with contextlib.suppress(OSError, ValueError):
                key.fileobj.close()  # type: ignore[union-attr]
        for f in self._files:
            f.close()
        self._sel.close()
