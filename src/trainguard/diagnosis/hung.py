"""A hung attempt's diagnosis, from the verdict the launcher wrote (stacks/hang.json). Pure.

The launcher confirmed the hang, dumped every rank's stack and named the culprit
(controller/hang_watch.py); this turns that record into the same Diagnosis shape a crash
gets, with the culprit's stack line as evidence and the other ranks' states as symptoms
(phrased as hang.classify.PHRASES, as in the culprit's reason).
"""

from __future__ import annotations

import re
from typing import Any

from trainguard.diagnosis.taxonomy import (
    HANG,
    Category,
    Culprit,
    Diagnosis,
    Evidence,
    FaultDomain,
    RestartHelps,
)
from trainguard.hang.classify import PHRASES, STOPPED


def hang_diagnosis(data: dict[str, Any], stack_texts: dict[int, tuple[str, str]]
                   ) -> Diagnosis:
    """`data`: hang.json; `stack_texts`: rank -> (file name, its text dump)."""
    c = data.get("culprit") or {}
    rank = c.get("rank") if isinstance(c.get("rank"), int) else None
    frame = c.get("frame") if isinstance(c.get("frame"), str) else None
    by_rank = {int(r): str(w) for r, w in (c.get("by_rank") or {}).items()
               if str(r).lstrip("-").isdigit()}
    reason = str(c.get("reason") or "no progress while every rank still ran")
    evidence = None
    if rank is not None and rank in stack_texts:
        evidence = _line_of(stack_texts[rank], frame, rank)
    symptoms = tuple(
        Evidence(stack_texts[r][0] if r in stack_texts else "", 1 if r in stack_texts else 0,
                 PHRASES[what][0] if what in PHRASES else what, r)
        for r, what in sorted(by_rank.items()) if r != rank)
    idle = data.get("idle_s")
    basis = data.get("basis") or ""
    summary = (f"hang: no progress for {idle}s ({basis}); {reason}" if idle is not None
               else f"hang: {reason}")
    advice = ("Look at the culprit's stack: a rank that does not reach the collective the "
              "others wait in (data loading, a lock, a loop) hangs them all; restart upon "
              "suspension (--restart-on-hang) resumes from the last checkpoint.")
    domain = FaultDomain.FRAMEWORK
    if rank is not None and by_rank.get(rank) == STOPPED:  # stopped from outside the job
        domain = FaultDomain.INFRASTRUCTURE  # (walk-through 24: it read `framework`)
        pid = re.search(r"kill -CONT ([\d ]+)`", reason)
        advice = (f"Rank {rank}'s process is stopped (state T): while the job is left hung, "
                  f"send it SIGCONT (`kill -CONT {pid.group(1) if pid else 'PID'}`) or find "
                  "what stopped it (a debugger, "
                  "Ctrl-Z, a job-control signal); restart upon suspension (--restart-on-hang) "
                  "replaces it and resumes from the last checkpoint.")
    return Diagnosis(
        Category.NCCL_TIMEOUT_OR_HANG, domain, RestartHelps.YES, summary,
        advice,
        Culprit(rank, None, frame), evidence, symptoms, False,
        float(c.get("confidence") or 0.6), HANG, None, from_log=False)


def _line_of(dump: tuple[str, str], frame: str | None, rank: int) -> Evidence:
    name, text = dump
    lines = text.splitlines()
    if frame:
        func = frame.rsplit(" in ", 1)[-1]
        where = frame.rsplit(" in ", 1)[0]
        for i, ln in enumerate(lines, 1):
            if func in ln and where.rsplit("/", 1)[-1].split(":")[0] in ln:
                return Evidence(name, i, ln.strip(), rank)
    first = next(((i, ln) for i, ln in enumerate(lines, 1) if ln.startswith(" ")), (1, ""))
    return Evidence(name, first[0], first[1].strip() or f"rank {rank}'s stack", rank)
