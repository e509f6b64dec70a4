"""Which steps survived and which were done again. Pure: no I/O.

The step samples of each attempt (step, when the workers reached it) are the step ledger's
(controller/recorder.py). A job goes back to redo steps at a restart point: an attempt's
start (it resumed after the step its checkpoint held) or an in-process restart's (the ranks
went back within the attempt). A step is wasted when a later restart point lies below it.

A pass that starts at a restart point counts every step from the point on, not only its
first sample: the ledger samples the new last step when a report comes, so the first sample
of a pass can lie a few steps past the resume (an in-process restart resumed after step 5 and
first sampled at 7 counted step 6 nowhere: walk-through 27 F10).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from itertools import pairwise

Span = tuple[float, float, str, int | None]  # (start, end, cause, attempt)


@dataclass(frozen=True)
class Resume:
    """A recovery that went back to a step: the attempt it happened in or ended, when it
    was detected, the step it resumed after, and whether it ended the attempt."""
    attempt: int
    detected: float
    step: int
    ends_attempt: bool


@dataclass(frozen=True)
class StepCounts:
    wasted_spans: list[Span]
    productive: int
    wasted: int
    step_seconds: list[tuple[int, int, float]]  # (attempt, step, seconds a step)


def count_steps(attempts: list[int], by_attempt: dict[int, list[tuple[int, float]]],
                resumes: list[Resume]) -> StepCounts:
    """`attempts` in order; `by_attempt`: each attempt's samples by time."""
    starts = _pass_starts(attempts, by_attempt, resumes)
    points = sorted((by_attempt[a][i][1], r) for (a, i), r in starts.items())
    times = [t for t, _ in points]
    suffix_min: list[float] = []
    low = float("inf")
    for _, step in reversed(points):
        low = min(low, step)
        suffix_min.append(low)
    suffix_min.reverse()

    def floor_after(t: float) -> float:
        k = bisect.bisect_right(times, t)
        return suffix_min[k] if k < len(suffix_min) else float("inf")

    spans: list[Span] = []
    productive = wasted = 0
    step_seconds: list[tuple[int, int, float]] = []
    for a in attempts:
        samples = by_attempt.get(a, [])
        for i, (s1, t1) in enumerate(samples):
            resumed = starts.get((a, i))
            if resumed is not None:  # a pass begins: its steps' time is start-up or recovery
                lost = _above(resumed, s1, floor_after(t1))
                wasted += lost
                productive += s1 - resumed - lost
                continue
            s0, t0 = samples[i - 1]
            n = s1 - s0
            step_seconds.append((a, s1, (t1 - t0) / n))
            lost = _above(s0, s1, floor_after(t1))
            wasted += lost
            productive += n - lost
            if lost:
                w0 = t1 - (t1 - t0) * lost / n
                if spans and spans[-1][1] == t0 and spans[-1][3] == a:
                    w0 = spans.pop()[0]  # the previous interval's waste runs into this one
                spans.append((w0, t1, "wasted_progress", a))
    return StepCounts(spans, productive, wasted, step_seconds)


def _above(s0: int, s1: int, floor: float) -> int:
    """How many of the steps s0+1 .. s1 lie above `floor` (done again later)."""
    if s1 <= floor:
        return 0
    return s1 - s0 if s0 >= floor else int(s1 - floor)


def _pass_starts(attempts: list[int], by_attempt: dict[int, list[tuple[int, float]]],
                 resumes: list[Resume]) -> dict[tuple[int, int], int]:
    """(attempt, index of a pass's first sample) -> the step the pass resumed after: a
    later attempt's first sample (after the step its predecessor's ending recovery resumed
    from), every sample lower than the one before (an in-process restart: the last such
    recovery detected before it). A resumed step at or past the sample is not believed:
    the step before the sample."""
    ended = {r.attempt: r.step for r in resumes if r.ends_attempt}
    inside = sorted((r.detected, r.attempt, r.step) for r in resumes if not r.ends_attempt)
    out: dict[tuple[int, int], int] = {}
    prev: int | None = None
    for a in attempts:
        samples = by_attempt.get(a, [])
        if samples:
            s = samples[0][0]
            step = ended.get(prev) if prev is not None else None
            out[(a, 0)] = step if step is not None and step < s else s - 1
        for i, ((s0, _), (s1, t1)) in enumerate(pairwise(samples), 1):
            if s1 <= s0:
                known = [st for d, at, st in inside if at == a and d <= t1]
                out[(a, i)] = known[-1] if known and known[-1] < s1 else s1 - 1
        prev = a
    return out
