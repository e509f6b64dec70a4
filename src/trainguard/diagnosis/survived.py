"""What a rank got past is not what it died of. Pure.

Two ways a rank shows it got past a failure:

- it trained on: what it logged more than SURVIVED_BEFORE_STEP before it reached the step
  before its latest (RankExit.second_last_step_at, from the agent's liveness book) it
  caught and trained past (a CUDA OOM that skipped a batch);
- it recovered in place and said so (worker.contract.RECOVERY_PATTERN, findings with
  `recovered`): a step re-executed on every rank, or a restart in place (a survivor's
  "restarting in place", a replacement's "started in place") that it stepped after. What
  its log holds before that line is the failure the job already recovered from: the same
  kind of failure later in the attempt is named by its own line, time and rank
  (walk-through 34 #10: a step re-executed at step 4, a second collective failure at step 8
  was diagnosed with step 4's line). The line retires what comes before it in the same
  file (by offset): no margin, which the toy's 0.1 s steps made the first way miss. Whether
  a restart line counts compares its stamp (when the node's agent read it) with the rank's
  step time (when the agent read the step line, or when the rank sent trainguard.progress):
  one host clock, the stamp later by the reader's delay (a step right after a line read late
  may not count; the next one does).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from trainguard.diagnosis.candidates import RankExit
from trainguard.diagnosis.findings import REEXECUTED, Finding

# a line its rank logged this long before two new steps went by: the rank caught it (a CUDA
# OOM that skipped a batch) and trained on (a margin: a log line's stamp and a step's are
# taken by different threads, and torch's error file stamps whole seconds; two steps: a
# progress bar redrawn at exit, after the fatal traceback, is one)
SURVIVED_BEFORE_STEP = timedelta(seconds=1)


def not_survived(seen: list[Finding], exits: Sequence[RankExit]) -> list[Finding]:
    """The findings a rank did not get past, without the recovery marks themselves.

    The exception a rank that exited by itself (a code > 0) died of stays, unless the rank
    recovered in place after it (then that exception was its dead process's)."""
    stepped = {e.rank: e.second_last_step_at for e in exits if e.second_last_step_at}
    exited = {e.rank for e in exits if e.returncode is not None and e.returncode > 0}
    past = _recovered_at(seen, stepped)
    kept = []
    for f in seen:
        if f.recovered is not None:
            continue
        mark = past.get((f.file, f.rank)) if f.rank is not None else None
        if mark is None and f.rank is None:  # a line of no known rank: any rank's mark
            mark = max((o for (name, _), o in past.items() if name == f.file), default=None)
        if mark is not None and f.offset < mark:
            continue
        if (f.rank in stepped and f.at is not None and not f.at_inherited
                and not (f.final and f.rank in exited)
                and f.at + SURVIVED_BEFORE_STEP < stepped[f.rank]):
            continue
        kept.append(f)
    return kept


def _recovered_at(seen: list[Finding], stepped: dict[int, datetime]) -> dict[
        tuple[str, int | None], int]:
    """(file, rank) -> the offset of the rank's last recovery line that counts there: a step
    re-executed; a restart in place the rank stepped after (its second-last step came later
    than the line; both times are the agent's clock), or that a later recovery line of the
    rank follows (the ladder restarts in place again only after progress: a replacement of a
    replacement that failed within two steps, review 36 #1)."""
    marks = sorted((m for m in seen if m.recovered is not None), key=lambda m: m.offset)
    past: dict[tuple[str, int | None], int] = {}
    for i, m in enumerate(marks):
        after = stepped.get(m.rank) if m.rank is not None else None
        if m.recovered == REEXECUTED or any(
                (n.file, n.rank) == (m.file, m.rank) for n in marks[i + 1:]) or (
                after is not None and m.at is not None and not m.at_inherited
                and after > m.at):
            key = (m.file, m.rank)
            past[key] = max(past.get(key, -1), m.offset)
    return past
