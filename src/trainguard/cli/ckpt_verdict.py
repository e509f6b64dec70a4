"""`trainguard ckpt verify`'s verdict from the rows `ckpt` lists, newest step first: is the
newest step valid, as a resume would find it. Both kinds of rows alike: trainguard.checkpoint's
steps (one row each) and a trainer integration's checkpoints, where one step may have several
copies (Lightning's `epoch=E-step=S.ckpt`, a `-v1` re-save of it, `last.ckpt`): the step is
valid when one of its copies is, as a resume takes that one, and a damaged copy beside it is
a warning, not the verdict (walk-through 35 F12: "step 20 is damaged; the newest valid step is
20", exit 1, on a job whose newest checkpoint was fine). Pure: rows in, lines out."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

from trainguard.checkpoint.manifest import Status

VALID = Status.VALID.value  # (a row is JSON: its status a string)


@dataclass(frozen=True)
class VerifyVerdict:
    valid: bool
    loads: dict[str, Any] | None = None  # valid: the copy a resume loads
    error: str = ""  # not valid: why, and what a resume loads instead
    warnings: list[str] = field(default_factory=list)  # valid, with a bad copy beside it


def _name(row: dict[str, Any]) -> str:
    path = row.get("path")
    return PurePath(path).name if isinstance(path, str) else f"step {row['step']}"


def judge(rows: list[dict[str, Any]], one_step: bool) -> VerifyVerdict:
    """The verdict on rows[0]'s step (`rows` newest first, not empty); `one_step`: the rows
    are the one step asked for (`--step N`), so no older step is named."""
    newest = rows[0]["step"]
    copies = [r for r in rows if r["step"] == newest]
    good = next((r for r in copies if r["status"] == VALID), None)
    if good is not None:
        return VerifyVerdict(True, good, warnings=[
            f"{_name(r)}, a copy of step {newest}, is {r['status']} "
            f"({r['reason'] or 'no reason given'}); a resume loads {_name(good)}, a valid "
            "copy of the same step" for r in copies if r["status"] != VALID])
    bad = copies[0]
    older = next((r["step"] for r in rows if r["step"] != newest and r["status"] == VALID),
                 None)
    then = ("" if one_step else f"; the newest valid step is {older}: a resume loads it"
            if older is not None else "; no step here is valid: a resume starts over")
    return VerifyVerdict(False, None, f"step {newest} is {bad['status']} "
                          f"({bad['reason'] or 'no reason given'}){then}")
