"""The console writer (trainguard/console.py) with real pipes: writes never wait for the
reader, what is queued comes out in order, and dropped lines are counted where they were."""

from __future__ import annotations

import io
import os
import threading
import time
from typing import IO

from trainguard.console import Console


def _pipe_console(limit: int) -> tuple[Console, int, IO[str]]:
    r, w = os.pipe()
    stream = os.fdopen(w, "w")
    return Console(stream, limit_bytes=limit), r, stream


def _read_all(fd: int) -> str:
    chunks = []
    while data := os.read(fd, 1 << 16):
        chunks.append(data)
    return b"".join(chunks).decode()


def test_writes_to_a_console_that_does_not_read_return_at_once_and_drop_past_the_limit(
) -> None:
    con, r, stream = _pipe_console(limit=200_000)
    line = "x" * 999 + "\n"
    t0 = time.monotonic()
    for i in range(1000):  # 1 MB into a 64 KiB pipe nobody reads
        con.write(f"{i:04d}{line}")
    assert time.monotonic() - t0 < 5  # never blocked on the pipe
    con.write("the last line\n")
    reader = threading.Thread(target=lambda: out.append(_read_all(r)))
    out: list[str] = []
    reader.start()
    con.close()
    stream.close()  # (the writer ended: EOF for the reader)
    reader.join(10)
    text = out[0].splitlines()
    kept = [ln[:4] for ln in text if ln[:4].isdigit()]
    assert kept == [f"{i:04d}" for i in range(len(kept))]  # in order, none lost in between
    notice = next(i for i, ln in enumerate(text) if "console line(s) dropped" in ln)
    dropped = int(text[notice].split()[1])
    assert len(kept) + dropped == 1000  # every line written or counted
    assert text[notice - 1][:4] == f"{len(kept) - 1:04d}"  # the notice where they went
    assert text[-1] == "the last line"  # a short line after the drop still fits


def test_a_console_that_reads_gets_everything_and_one_that_went_away_costs_nothing() -> None:
    s = io.StringIO()
    con = Console(s)  # no file descriptor: written through the stream's own write()
    for i in range(100):
        con.write(f"line {i}\n")
    con.close()
    assert s.getvalue() == "".join(f"line {i}\n" for i in range(100))
    assert con.write("after close\n") == 0

    gone, r, _ = _pipe_console(limit=1 << 20)
    os.close(r)  # the reader went away: EPIPE, dropped without an error
    gone.write("nobody reads this\n")
    gone.close(timeout=5)
    assert not gone._thread.is_alive()
