"""Rank logs for the job view: which logs there are, and a tail (or the lines around one
line) with the diagnosis' deciding line and its symptoms marked."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any

from trainguard.controller.store import JobStore
from trainguard.paths import rank_log_path
from trainguard.records import Reason
from trainguard.ui import jobfiles
from trainguard.ui.eventlog import EventLog
from trainguard.ui.jobs import RECENT_INCIDENTS
from trainguard.ui.logtail import LogLine, Slice, around, tail

DECISIVE = "decisive"
SYMPTOM = "symptom"
_ATTEMPT = re.compile(r"attempt-(\d+)$")
_RANK = re.compile(r"rank-(\d+)\.log$")


def list_logs(job_dir: Path) -> list[dict[str, Any]]:
    """Every rank log of the job: attempt, rank, size; by attempt then rank. Only regular
    files of the job dir's owner are listed (ui/jobfiles.py); Refused when the log dir
    itself may not be read."""
    with JobStore.open(job_dir) as store:
        root = jobfiles.log_root(job_dir, store.meta())
    out: list[dict[str, Any]] = []
    attempts = [(int(m.group(1)), name) for name, st in jobfiles.entries(root)
                if (m := _ATTEMPT.match(name)) is not None and stat.S_ISDIR(st.st_mode)]
    for a, name in attempts:
        try:
            files = jobfiles.entries(root, [name])
        except jobfiles.Refused:
            continue
        for f, st in files:
            m = _RANK.match(f)
            if m is not None and stat.S_ISREG(st.st_mode) and st.st_uid == root.owner:
                out.append({"attempt": a, "rank": int(m.group(1)), "size": st.st_size})
    return sorted(out, key=lambda x: (x["attempt"], x["rank"]))


def marks_for(job_dir: Path, attempt: int, rank: int) -> list[dict[str, Any]]:
    """The evidence of this attempt's diagnoses that is a line of this rank's log: the
    deciding line (`decisive`) and the symptoms, each with file, line and text."""
    with EventLog(job_dir) as log:
        diags = log.newest(RECENT_INCIDENTS, [Reason.FAILURE_DIAGNOSED.value])
    found: list[dict[str, Any]] = []
    for _, ev in diags:
        if ev.involved.attempt != attempt or not ev.data:
            continue
        evidence = ev.data.get("evidence")
        pieces = [(DECISIVE, evidence)] if isinstance(evidence, dict) else []
        pieces += [(SYMPTOM, s) for s in ev.data.get("symptoms") or [] if isinstance(s, dict)]
        found += [{"kind": kind, "file": e.get("file"), "line": e.get("line"),
                   "text": e.get("text") or ""}
                  for kind, e in pieces if _names_log(e, attempt, rank)]
    return found


def _names_log(evidence: dict[str, Any], attempt: int, rank: int) -> bool:
    """Does the evidence's file name this attempt's rank log? (`logs/attempt-N/rank-R.log`
    relative to the job dir, or `rank-R.log` when the logs are elsewhere.)"""
    name = str(evidence.get("file") or "")
    if evidence.get("rank") not in (None, rank):
        return False
    return name.endswith(f"attempt-{attempt}/rank-{rank}.log") or name == f"rank-{rank}.log"


def read_log(job_dir: Path, attempt: int, rank: int, *, lines: int = 200,
             line: int | None = None, context: int = 20) -> dict[str, Any]:
    """A tail of the rank log (or the lines around `line`), each line with its mark.
    FileNotFoundError when the job has no such log; jobfiles.Refused when it is not a
    file the dashboard serves (a symlink, another user's, outside the job dir)."""
    with JobStore.open(job_dir) as store:
        root = jobfiles.log_root(job_dir, store.meta())
    names = rank_log_path(Path(), attempt, rank).parts
    fd = jobfiles.open_file(root, names)
    try:
        part = tail(fd, lines) if line is None else around(fd, line, context)
    finally:
        os.close(fd)
    marks = marks_for(job_dir, attempt, rank)
    doc: dict[str, Any] = {"attempt": attempt, "rank": rank, "path": str(root.under(*names)),
                           **part.to_dict(), "marks": marks}
    doc["lines"] = [dict(ln.to_dict(), mark=mark_of(ln, marks)) for ln in part.lines]
    return doc


def mark_of(ln: LogLine, marks: list[dict[str, Any]]) -> str | None:
    """`decisive`, `symptom` or None: by line number when both have one, else by text."""
    best: str | None = None
    for m in marks:
        if ln.n is not None and isinstance(m["line"], int) and m["line"] > 0:
            hit = ln.n == m["line"]
        else:
            want = m["text"].strip()
            hit = bool(want) and (ln.text.strip() == want or want in ln.text)
        if hit and (best is None or m["kind"] == DECISIVE):
            best = m["kind"]
    return best


__all__ = ["DECISIVE", "SYMPTOM", "Slice", "list_logs", "marks_for", "read_log"]
