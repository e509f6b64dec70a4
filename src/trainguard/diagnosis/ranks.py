"""Two processes that announce the same global rank: the launch gave two nodes (or two
processes) one rank, so the rendezvous can never fill. Pure.

Lightning prints `initializing ddp: GLOBAL_RANK: 1, MEMBER: 2/8` (newer versions
`Initializing distributed: ...`) once in each process it starts. The same rank announced on
two lines of the logs means two processes took it: each node computed itself as node 0
(the node rank or the scheduler's task layout not passed through), and the job hangs at
the process group's start the same way on every launch (round 44: the 3 logs of the sets
with a rank announced twice are all config_error/no). One announcement alone says nothing:
the lines decide only as a pair, so the rule that finds them (`ddp-rank-announced`,
rules.yaml) never decides by itself; its findings are taken out before the rules' verdict.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from trainguard.diagnosis.fallback import WEAK
from trainguard.diagnosis.findings import Finding
from trainguard.diagnosis.taxonomy import (
    Category,
    Culprit,
    Diagnosis,
    FaultDomain,
    RestartHelps,
)

RULE = "ddp-rank-announced"
_ANNOUNCE = re.compile(r"GLOBAL_RANK: (\d+), MEMBER: \d+/(\d+)")


def split_announcements(seen: Sequence[Finding]) -> tuple[list[Finding], Finding | None]:
    """(the findings but the rank announcements, the second line to announce a rank already
    announced on another line, or None)."""
    first: dict[tuple[str, str], Finding] = {}
    twice: Finding | None = None
    rest: list[Finding] = []
    for f in seen:
        if f.rule != RULE:
            rest.append(f)
            continue
        m = _ANNOUNCE.search(f.text)
        if m is None or twice is not None:
            continue
        key = (m.group(1), m.group(2))
        if key in first and (first[key].file, first[key].line) != (f.file, f.line):
            twice = f
        first.setdefault(key, f)
    return rest, twice


def rank_taken_twice(d: Diagnosis | None, twice: Finding | None) -> Diagnosis | None:
    """`d`, or the launch's verdict when a rank was announced twice and `d` is silent or
    weak (no answer, `other`, a hint)."""
    if twice is None or (d is not None and d.confidence >= WEAK
                         and d.category != Category.OTHER):
        return d
    m = _ANNOUNCE.search(twice.text)
    rank = m.group(1) if m else "?"
    seen = (d.evidence,) if d is not None and d.evidence is not None else ()
    return Diagnosis(
        Category.CONFIG_ERROR, FaultDomain.USER_CODE, RestartHelps.NO,
        f"global rank {rank} was announced by two processes: {twice.text.strip()[:200]}",
        "Two processes took the same global rank: each node computed itself as the same node "
        "(the node rank, or the scheduler's tasks per node, did not reach the launcher); set "
        "the node rank / number of nodes and tasks per node so every process gets its own "
        "rank. A relaunch with the same settings hangs the same way.",
        culprit=Culprit(rank=twice.rank), evidence=twice.evidence(),
        symptoms=(*seen, *(d.symptoms if d is not None else ()))[:10],
        confidence=0.5, subcategory="rank_twice", rule=RULE)
