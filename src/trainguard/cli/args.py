"""What the commands' arguments share: argparse types that refuse a value rather than match
nothing, and the words for a rank or attempt the job does not have.

A refused value is echoed as typed; `Parser.error` (cli/__init__) turns an invalid choice
into one line that lists the valid values, as it does for `choices=`, and a message with
its own `Fix:` into `--flag: problem. Fix: ...`.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence

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
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if math.isnan(value):
        raise _refused(text, "is not a number", "a number of days")
    if value < 0:
        raise _refused(text, "is negative", "a number of days")
    if value > MAX_DAYS:  # past what a date can go back to (inf too)
        raise argparse.ArgumentTypeError(f"{text.strip()} days is more than {MAX_DAYS:,} days. "
                                         f"Fix: give a number of days from 0 to {MAX_DAYS:,}")
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
