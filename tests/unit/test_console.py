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
    # in order, and every line written or counted by a notice where it went: each notice
    # stands between the last line kept before the drop and the next one kept (the writer
    # thread can make room while the loop still writes: lines kept again after a drop, as
    # on a loaded CI machine, with a second notice)
    expect, dropped = 0, 0
    for ln in text[:-1]:
        if "console line(s) dropped" in ln:
            n = int(ln.split()[1])
            dropped, expect = dropped + n, expect + n
        else:
            assert ln[:4] == f"{expect:04d}", (ln[:40], expect)
            expect += 1
    assert expect == 1000 and dropped > 0  # 1 MB into 200 KB: some were dropped
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
