"""A controller that took a job over echoes its ranks' output from their logs
(controller/echo.py): from the takeover on, across attempts, as the agents' console would."""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any

from trainguard.controller.echo import RankEcho

T = "2026-12-05T10:00:00.000000+00:00"


def log(d: Path, attempt: int, rank: int, *lines: str) -> None:
    path = d / f"attempt-{attempt}" / f"rank-{rank}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write("".join(lines))


def wait_for(buf: io.StringIO, text: str) -> None:
    deadline = time.monotonic() + 10
    while text not in buf.getvalue():
        assert time.monotonic() < deadline, buf.getvalue()
        time.sleep(0.02)


def test_output_after_the_takeover_is_echoed_across_attempts(tmp_path: Path) -> None:
    log(tmp_path, 0, 0, f"{T} out before the takeover\n")
    buf = io.StringIO()
    echo = RankEcho(tmp_path, 0, buf, lambda rank: (True, True), poll_s=0.02)
    echo.start()
    try:
        log(tmp_path, 0, 0, f"{T} out step 5\n", f"{T} err a warning\n", f"{T} out half")
        wait_for(buf, "[rank 0] a warning\n")
        log(tmp_path, 0, 0, " a line\n")  # a partial line waits for its end
        log(tmp_path, 1, 1, f"{T} out restarted\n")  # the next attempt, a new rank file
        wait_for(buf, "[rank 1] restarted\n")
        log(tmp_path, 1, 1, f"{T} out the last line\n")
    finally:
        echo.close()  # what the logs hold is echoed before it stops
    assert buf.getvalue() == ("[rank 0] step 5\n[rank 0] a warning\n[rank 0] half a line\n"
                              "[rank 1] restarted\n[rank 1] the last line\n")


def test_the_console_choices_of_the_job_hold(tmp_path: Path) -> None:
    """--redirects / --local-ranks-filter: rank 1 not shown, rank 0's stderr kept off."""
    buf = io.StringIO()
    echo = RankEcho(tmp_path, 0, buf, lambda rank: (rank == 0, False), poll_s=0.02)
    echo.start()
    log(tmp_path, 0, 0, f"{T} out shown\n", f"{T} err hidden\n")
    log(tmp_path, 0, 1, f"{T} out hidden too\n")
    echo.close()
    assert buf.getvalue() == "[rank 0] shown\n"


def test_a_log_that_grew_a_lot_is_read_in_bounded_pieces(tmp_path: Path,
                                                         monkeypatch: Any) -> None:
    from trainguard.controller import echo as echo_mod

    monkeypatch.setattr(echo_mod, "MAX_READ", 64)

    class Writes(io.StringIO):  # each write is what one read of at most MAX_READ gave
        sizes: list[int] = []

        def write(self, s: str) -> int:
            self.sizes.append(len(s))
            return super().write(s)

    buf = Writes()
    e = RankEcho(tmp_path, 0, buf, lambda rank: (True, True), poll_s=0.02)
    lines = [f"{T} out line {i}\n" for i in range(20)] + [f"{T} out " + "x" * 100 + "\n"]
    log(tmp_path, 0, 0, *lines)
    e.start()
    e.close()
    got = buf.getvalue()
    assert all(f"[rank 0] line {i}\n" in got for i in range(20)), got
    assert got.count("x") == 100  # the long line came in pieces, nothing lost
    assert len(buf.sizes) > 10 and max(buf.sizes) < 64 + 20  # read 64 bytes at a time
