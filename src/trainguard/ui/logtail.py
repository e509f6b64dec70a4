"""Bounded reads of rank logs, which may be gigabytes: the last lines (read backwards from
the end, block by block) or the lines around one line number (read forwards, block by
block, counting newlines). Neither ever holds more than a few blocks of the file.

A line of a rank log is `<ISO time> <out|err> <text>` (worker/contract.py); `split_line`
takes it apart, and leaves any other line whole.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

BLOCK = 64 * 1024
MAX_LINES = 5000  # the most lines one request returns
MAX_BYTES = 4 * 2**20  # the most bytes of lines one request returns
NUMBER_LIMIT = 8 * 2**20  # files up to this size get line numbers on a tail (one scan)
BIG_BLOCK = 16 * BLOCK  # forward reads
MAX_LINE = 64 * 1024  # a longer line is shown cut (the node's log writer splits at this)
_STREAMS = ("out", "err")
Source = Path | int  # a file's path, or an fd the caller opened (and closes)


@dataclass(frozen=True)
class LogLine:
    n: int | None  # 1-based line number; None when unknown (a tail of a big file)
    time: str | None
    stream: str | None  # out | err
    text: str

    def to_dict(self) -> dict[str, object]:
        return {"n": self.n, "time": self.time, "stream": self.stream, "text": self.text}


@dataclass(frozen=True)
class Slice:
    """Some lines of a file, with where they are."""

    lines: list[LogLine]
    size: int  # the file's size when read
    start: int  # byte offset of the first line
    complete: bool  # False: the request's limits cut it short

    def to_dict(self) -> dict[str, object]:
        return {"size": self.size, "start": self.start, "complete": self.complete,
                "lines": [ln.to_dict() for ln in self.lines]}


def split_line(raw: str, n: int | None) -> LogLine:
    """One log line, its stamp and stream taken off when it has them."""
    stamp, sep, rest = raw.partition(" ")
    stream, _, text = rest.partition(" ")
    if sep and stream in _STREAMS and stamp[10:11] == "T":
        return LogLine(n, stamp, stream, text)
    return LogLine(n, None, None, raw)


def _decode(raw: bytes) -> str:
    cut = len(raw) > MAX_LINE
    text = raw[:MAX_LINE].decode("utf-8", errors="replace").rstrip("\r")
    return text + f" ... ({len(raw) - MAX_LINE} more bytes)" if cut else text


def _open(source: Source) -> BinaryIO:
    """`source` to read; an fd stays open after (ui/jobfiles.py opens the dashboard's)."""
    return open(source, "rb", closefd=not isinstance(source, int))


def tail(path: Source, lines: int) -> Slice:
    """The last `lines` lines of `path` (at most MAX_LINES, MAX_BYTES), read backwards."""
    want = max(0, min(lines, MAX_LINES))
    with _open(path) as f:
        size = os.fstat(f.fileno()).st_size
        pos, chunks, newlines = size, [], 0
        # want + 1 newlines (+1 for the file's last): the start of the first line is known
        while pos > 0 and newlines <= want + 1 and size - pos < MAX_BYTES:
            step = min(BLOCK, pos)
            pos -= step
            f.seek(pos)
            block = f.read(step)
            chunks.append(block)
            newlines += block.count(b"\n")
    data = b"".join(reversed(chunks))
    end = size - 1 if data.endswith(b"\n") else size
    parts = data[: end - pos].split(b"\n") if end > pos else []
    if pos > 0 and parts:
        parts = parts[1:]  # it may begin in the middle of a line
    complete = pos == 0 or len(parts) >= want
    parts = parts[-want:] if want else []
    start = end - sum(len(p) for p in parts) - max(len(parts) - 1, 0) if parts else size
    first = _first_number(path, start, size) if parts else None
    out = [split_line(_decode(p), None if first is None else first + i)
           for i, p in enumerate(parts)]
    return Slice(out, size, start, complete)


def _first_number(path: Source, offset: int, size: int) -> int | None:
    """The 1-based number of the line that starts at `offset`: the newlines before it plus
    one, counted block by block; None for files over NUMBER_LIMIT (too slow to count)."""
    if size > NUMBER_LIMIT:
        return None
    count = 0
    with _open(path) as f:
        f.seek(0)
        left = offset
        while left > 0:
            block = f.read(min(BIG_BLOCK, left))
            if not block:
                break
            count += block.count(b"\n")
            left -= len(block)
    return count + 1


def around(path: Source, line: int, context: int) -> Slice:
    """Lines `line - context` .. `line + context` of `path` (1-based), read forwards; a
    line longer than BIG_BLOCK keeps only its last BIG_BLOCK bytes."""
    context = max(0, min(context, MAX_LINES // 2))
    first, last = max(1, line - context), line + context
    out: list[LogLine] = []
    n, offset, carry, used, start = 1, 0, b"", 0, -1  # n: the line starting at `offset`
    with _open(path) as f:
        f.seek(0)
        size = os.fstat(f.fileno()).st_size
        while n <= last and used < MAX_BYTES:
            block = f.read(BIG_BLOCK)
            if not block:
                break
            data, base = carry + block, offset
            newlines = data.count(b"\n")
            if n + newlines < first:  # every line that ends here comes before the window
                cut = max(data.rfind(b"\n") + 1, len(data) - BIG_BLOCK)
                n, offset, carry = n + newlines, base + cut, data[cut:]
                continue
            *whole, carry = data.split(b"\n")
            for raw in whole:
                if first <= n <= last and used < MAX_BYTES:
                    start = offset if start < 0 else start
                    out.append(split_line(_decode(raw), n))
                    used += len(raw) + 1
                offset, n = offset + len(raw) + 1, n + 1
            if len(carry) > BIG_BLOCK:  # a line without an end yet: keep its last part
                offset, carry = offset + len(carry) - BIG_BLOCK, carry[-BIG_BLOCK:]
        if carry and first <= n <= last and used < MAX_BYTES:
            start = offset if start < 0 else start
            out.append(split_line(_decode(carry), n))
    return Slice(out, size, size if start < 0 else start, used < MAX_BYTES)
