"""What the commands' arguments share: argparse types that refuse a value rather than match
nothing, and the words for a rank or attempt the job does not have.

A refused value is echoed as typed; `Parser.error` (cli/__init__) turns an invalid choice
into one line that lists the valid values, as it does for `choices=`, and a message with
its own `Fix:` into `--flag: problem. Fix: ...`.
"""

from __future__ import annotations

import argparse
import contextlib
import math
from collections.abc import Callable, Sequence
from pathlib import Path

from trainguard.paths import DB_NAME, DEFAULT_RUNS_DIR
from trainguard.records import rank_list


def one_of(names: Sequence[str]) -> Callable[[str], str]:
    """An argparse type: one of `names` in any case (`error`, `ERROR`), given back as spelled
    in `names`."""
    canonical = {n.lower(): n for n in names}

    def parse(text: str) -> str:
        if text.strip().lower() not in canonical:
            raise _invalid(text, names)
        return canonical[text.strip().lower()]

    return parse


def one_or_more_of(names: Sequence[str]) -> Callable[[str], list[str]]:
    """An argparse type: comma-separated names of `names`, each in any case."""
    one = one_of(names)
    return lambda text: [one(item) for item in text.split(",")]


def _invalid(text: str, names: Sequence[str]) -> argparse.ArgumentTypeError:
    # argparse's own words for a bad choice, which Parser.error makes one line of
    return argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from "
                                      f"{', '.join(names)})")


def count(text: str) -> int:
    """An argparse type: a whole number, 0 or more (`--tail N`)."""
    try:
        value = int(text)
    except ValueError:
        raise _refused(text, "is not a whole number", "a whole number") from None
    if value < 0:
        raise _refused(text, "is negative", "a whole number")
    return value


MAX_DAYS = 100_000  # about 270 years: every job is younger, and the date arithmetic holds


def days(text: str) -> float:
    """An argparse type: a number, 0 or more (`--older-than DAYS`); not nan, not inf."""
    value = _non_negative(text, "a number of days")
    if value > MAX_DAYS:  # past what a date can go back to (inf too)
        raise argparse.ArgumentTypeError(f"{text.strip()} days is more than {MAX_DAYS:,} days. "
                                         f"Fix: give a number of days from 0 to {MAX_DAYS:,}")
    return value


def seconds(text: str) -> float:
    """An argparse type: a number of seconds, 0 or more (`stop --timeout`); `inf` waits as
    long as it takes. Walk-through 35 F3: `--timeout -1` signalled the launcher, then said
    "still running after -1s" and exited 1, the code of a stop that failed."""
    return _non_negative(text, "a number of seconds")


def _non_negative(text: str, what: str) -> float:
    """`text` as a number, 0 or more (inf too); else the refusal that says `what` to give."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if math.isnan(value):
        raise _refused(text, "is not a number", what)
    if value < 0:
        raise _refused(text, "is negative", what)
    return value


def _refused(text: str, problem: str, what: str) -> argparse.ArgumentTypeError:
    """`-1 is negative. Fix: give a number of days, 0 or more` (the flag is put in front)."""
    shown = text.strip() if text.strip() and " " not in text.strip() else repr(text)
    return argparse.ArgumentTypeError(f"{shown} {problem}. Fix: give {what}, 0 or more")


def not_in_job(noun: str, value: int, have: Sequence[int], flag: str) -> str:
    """`the job has no rank 5: its ranks are 0, 1 (pick one with --rank)`."""
    if not have:
        return f"the job has no {noun} {value}: it has no {noun}s yet"
    return (f"the job has no {noun} {value}: its {noun}s are {rank_list(have)} (pick one "
            f"with {flag})")


def job_dir_of(command: str) -> Callable[[str], str]:
    """An argparse type for JOB_DIR: a job dir as given; a run id, when a job of that id lies
    under ./trainguard-runs (where `run` puts a job given no --job-dir) and no such path is
    here; "" (the argument left out): the job there that changed last, said on stderr."""
    from trainguard.cli.fmt import complain
    from trainguard.ui.catalog import find_job_dirs

    runs = Path(DEFAULT_RUNS_DIR)

    def parse(text: str) -> str:
        if text:  # a run id, unless a job dir of that name is here (a file of it is not)
            if not (Path(text) / DB_NAME).is_file() and (runs / text / DB_NAME).is_file():
                return str(runs / text)
            return text
        jobs = find_job_dirs(runs.resolve(), depth=1) if runs.is_dir() else []
        changed = {d: t for d in jobs if (t := _changed_at(d)) is not None}
        if not changed:
            raise argparse.ArgumentTypeError(
                f"no JOB_DIR given, and no job under ./{DEFAULT_RUNS_DIR} to default to. Fix: "
                "pass the job dir printed by `trainguard run` (`trainguard ls DIR` lists the "
                "jobs under DIR)")
        newest = max(changed, key=lambda d: changed[d])
        shown = newest.relative_to(Path.cwd().resolve()) if newest.is_relative_to(
            Path.cwd().resolve()) else newest
        if len(jobs) > 1:
            complain(command, f"no JOB_DIR given: {shown}, the job under ./{DEFAULT_RUNS_DIR} "
                     f"that changed last (of {len(jobs)})", "note")
        return str(newest)

    return parse


def _changed_at(job_dir: Path) -> float | None:
    """When a job's store last changed: its db or the SQLite write-ahead log a running job
    writes (None: gone meanwhile, a prune)."""
    times = []
    for name in (DB_NAME, f"{DB_NAME}-wal"):
        with contextlib.suppress(OSError):
            times.append((job_dir / name).stat().st_mtime)
    return max(times) if times else None
