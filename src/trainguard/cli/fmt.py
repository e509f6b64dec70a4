"""What the read commands share: clocks, dashes, JSON and the console."""

from __future__ import annotations

import json
import os
import sys
from datetime import datetime, timezone
from typing import Any

from rich.console import Console
from rich.table import Table

from trainguard.records import Involved, plural, size_text


def clock(t: datetime) -> str:
    """Local wall-clock time HH:MM:SS.mmm."""
    local = t.astimezone()
    return local.strftime("%H:%M:%S.") + f"{local.microsecond // 1000:03d}"


def involved_text(inv: Involved) -> str:
    """`node n1 · rank 1 · attempt 0`; `job` when only the job is involved."""
    parts = [
        f"{name} {value}"
        for name, value in (("node", inv.node), ("rank", inv.rank), ("attempt", inv.attempt))
        if value is not None
    ]
    return " · ".join(parts) or "job"


def meta_time(value: Any) -> datetime | None:
    """A time kept in meta: an ISO 8601 string or epoch seconds."""
    if isinstance(value, str):
        try:
            t = datetime.fromisoformat(value)
        except ValueError:
            return None
        return t if t.tzinfo is not None else t.replace(tzinfo=timezone.utc)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return datetime.fromtimestamp(value, tz=timezone.utc)
    return None


def dash(v: object) -> str:
    return "-" if v is None else str(v)


def clock_or_dash(value: Any) -> str:
    at = meta_time(value)
    return "-" if at is None else clock(at)


def complain(command: str, message: str, kind: str = "error") -> None:
    """Every message a command writes on stderr, in argparse's shape: `trainguard CMD: error:
    ...` (or `warning:` / `note:`), so every command's errors read alike and a script can grep
    one prefix. `command` is the subcommand as typed (`logs`, `ckpt verify`)."""
    sys.stdout.flush()  # what stdout already holds first: the message reads under it
    print(f"trainguard {command}: {kind}: {message}", file=sys.stderr, flush=True)


def print_json(doc: object) -> None:
    sys.stdout.write(json.dumps(doc, indent=2) + "\n")


def console_out() -> Console:
    """Lines are not cut at the console width; tables fit a terminal, or COLUMNS (200 when
    unset) in a pipe."""
    width = None if sys.stdout.isatty() else _columns()
    return Console(highlight=False, soft_wrap=True, width=width)


PIPE_WIDTH = 200  # columns in a pipe when COLUMNS is unset


def _columns() -> int:
    try:
        return max(40, int(os.environ.get("COLUMNS") or PIPE_WIDTH))
    except ValueError:
        return PIPE_WIDTH


def print_table(table: Table) -> None:
    """A table without the trailing blanks rich pads its last column with."""
    console = console_out()
    with console.capture() as captured:
        console.print(table)
    sys.stdout.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))


__all__ = ["PIPE_WIDTH", "clock", "clock_or_dash", "complain", "console_out", "dash",
           "involved_text", "meta_time", "plural", "print_json", "print_table", "size_text"]
