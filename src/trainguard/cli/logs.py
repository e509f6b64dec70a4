"""`trainguard logs JOB_DIR [--rank R] [--attempt N] [--tail N] [-f] [--json]`: a rank's log,
followed across restarts.

Logs live at LOG_DIR/attempt-N/rank-R.log (trainguard.paths). Files are copied in blocks and
tails read backwards from the end, so a log of any size costs little memory. `-f` prints new
lines as they come and, when the job starts a new attempt, goes on in that attempt's log
(with a `==> attempt N <==` line) until the job has ended.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainguard.cli.args import count, not_in_job
from trainguard.cli.fmt import complain
from trainguard.cli.read import add_job_dir, follow_ended, job_finished
from trainguard.controller.store import JobStore
from trainguard.controller.store_rows import log_dir_of
from trainguard.errors import StoreError
from trainguard.exitcodes import ExitCode
from trainguard.paths import rank_log_path
from trainguard.ui.logtail import MAX_BYTES, MAX_LINES, tail

FOLLOW_POLL_S = 0.25
BLOCK = 1 << 16
FILE_START = 0  # offset
_ATTEMPT_DIR = re.compile(r"attempt-(\d+)$")


def add_logs_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("logs", help="print a rank's log; -f follows it across restarts",
                       description="Print the log of one rank (rank 0 by default) of the "
                       "job's latest attempt (or --attempt N); -f follows it, into each new "
                       "attempt, until the job ends.")
    add_job_dir(p)
    p.add_argument("--rank", type=int, default=0, help="the global rank (0)")
    p.add_argument("--attempt", type=int, help="the attempt (default: the latest with a log "
                   "of that rank)")
    p.add_argument("--tail", type=count, metavar="N", help="only the last N lines (at most "
                   "5000)")
    p.add_argument("-f", "--follow", action="store_true",
                   help="keep printing new lines, into later attempts, until the job ends")
    p.add_argument("--json", action="store_true",
                   help="one JSON object per line: {attempt, rank, line}")
    p.set_defaults(func=cmd_logs)


def _missing(log_dir: Path, rank: int, attempt: int | None, attempts: list[int]) -> str:
    """Why there is no log to show, naming the ranks (and attempts) that have one."""
    ranks = sorted({int(m.group(1)) for f in log_dir.glob("attempt-*/rank-*.log")
                    if (m := re.fullmatch(r"rank-(\d+)\.log", f.name))})
    where = "" if attempt is None else f" in attempt {attempt}"
    if rank not in ranks:
        return (not_in_job("rank", rank, ranks, "--rank") if ranks
                else f"no rank has a log under {log_dir} yet")
    return (f"no log of rank {rank}{where} under {log_dir}; attempts with one: "
            f"{', '.join(map(str, attempts))} (pick one with --attempt)")


def cmd_logs(args: argparse.Namespace) -> int:
    job_dir = Path(args.job_dir)
    try:
        with JobStore.open(job_dir) as store:
            meta = store.meta()
    except StoreError as e:
        complain("logs", str(e))
        return ExitCode.NO_JOB
    log_dir = log_dir_of(meta, job_dir)
    attempts = rank_attempts(log_dir, args.rank)
    attempt = args.attempt if args.attempt is not None else (attempts[-1] if attempts else None)
    if attempt is None or (attempt not in attempts
                           and not (args.follow and _log_to_come(meta, attempt))):
        complain("logs", _missing(log_dir, args.rank, attempt, attempts))
        return ExitCode.NO_JOB
    out = _Out(args.json, args.rank)
    try:
        pos = _print_existing(rank_log_path(log_dir, attempt, args.rank), attempt, args.tail, out)
        if args.follow:
            _follow(job_dir, log_dir, args.rank, attempt, pos, out)
            return follow_ended(_meta(job_dir), str(job_dir), "logs")
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
    return ExitCode.SUCCESS


def _log_to_come(meta: dict[str, Any], attempt: int) -> bool:
    """Whether `-f` may wait for the log of `attempt`: the job runs and that is its current
    attempt (the rank has not written a line yet). Not an attempt still to come: `-f` goes
    on into later attempts by itself, and one that never comes would wait for nothing."""
    return not job_finished(meta) and meta.get("attempt") == attempt


def rank_attempts(log_dir: Path, rank: int) -> list[int]:
    """The attempts that have a log of `rank`, in order."""
    found = []
    try:
        for d in log_dir.iterdir():
            m = _ATTEMPT_DIR.match(d.name)
            if m and (d / f"rank-{rank}.log").is_file():
                found.append(int(m.group(1)))
    except OSError:
        return []
    return sorted(found)


class _Out:
    def __init__(self, as_json: bool, rank: int) -> None:
        self.as_json, self.rank = as_json, rank

    def lines(self, attempt: int, text: str) -> None:
        if not text:
            return
        if self.as_json:
            for line in text.splitlines():
                sys.stdout.write(json.dumps({"attempt": attempt, "rank": self.rank,
                                             "line": line}) + "\n")
        else:
            sys.stdout.write(text)
        sys.stdout.flush()

    def header(self, attempt: int) -> None:
        if not self.as_json:
            sys.stdout.write(f"==> attempt {attempt} <==\n")


def _print_existing(path: Path, attempt: int, tail_n: int | None, out: _Out) -> int:
    """Print the file (or its last `tail` lines); returns the offset printed up to."""
    try:
        size = path.stat().st_size
    except OSError:
        return FILE_START
    if tail_n is not None:
        got = tail(path, tail_n)
        if len(got.lines) < tail_n and got.start > 0:  # the cap cut it, not the log's start
            complain("logs", f"--tail shows at most {MAX_LINES} lines ({MAX_BYTES // 2**20} MiB); "
                     f"these are the last {len(got.lines)} of a longer log (all of it: leave "
                     "--tail out)", "note")
        out.lines(attempt, "".join(
            (f"{ln.time} {ln.stream} {ln.text}" if ln.time else ln.text) + "\n"
            for ln in got.lines))
        return got.size
    for chunk in _chunks(path, 0, size):
        out.lines(attempt, chunk)
    return size


def _chunks(path: Path, start: int, end: int) -> Iterator[str]:
    """Whole lines between `start` and `end` (a partial last line waits for its newline)."""
    with open(path, "rb") as f:
        f.seek(start)
        left = end - start
        carry = b""
        while left > 0:
            data = f.read(min(BLOCK, left))
            if not data:
                break
            left -= len(data)
            data = carry + data
            cut = data.rfind(b"\n") + 1
            carry = data[cut:]
            if cut:
                yield data[:cut].decode("utf-8", "replace")
        if carry and left <= 0:
            yield carry.decode("utf-8", "replace")


def _follow(job_dir: Path, log_dir: Path, rank: int, attempt: int, pos: int,
            out: _Out) -> None:
    path = rank_log_path(log_dir, attempt, rank)
    ended_seen = False
    while True:
        grown = _grown(path, pos)
        if grown is not None:
            text, pos = grown
            out.lines(attempt, text)
        later = [a for a in rank_attempts(log_dir, rank) if a > attempt]
        if later:
            attempt, path, pos = later[0], rank_log_path(log_dir, later[0], rank), 0
            out.header(attempt)
            continue
        finished = _finished(job_dir)
        if finished and ended_seen and grown is None:
            return
        ended_seen = finished
        time.sleep(FOLLOW_POLL_S)


def _grown(path: Path, pos: int) -> tuple[str, int] | None:
    """New whole lines since `pos` and the offset after them; None when nothing new."""
    try:
        size = path.stat().st_size
    except OSError:
        return None
    if size <= pos:
        return None
    with open(path, "rb") as f:
        f.seek(pos)
        data = f.read(size - pos)
    cut = data.rfind(b"\n") + 1
    if not cut:
        return None
    return data[:cut].decode("utf-8", "replace"), pos + cut


def _meta(job_dir: Path) -> dict[str, Any] | None:
    try:
        with JobStore.open(job_dir) as store:
            return store.meta()
    except StoreError:
        return None


def _finished(job_dir: Path) -> bool:
    meta = _meta(job_dir)
    return meta is None or job_finished(meta)
