"""How often a job should checkpoint: Young/Daly from its observed MTBF and blocking save
time. Pure.

Young: tau = sqrt(2 w M). Daly (w < 2M): tau = sqrt(2 w M) [1 + (1/3) sqrt(w / 2M)
+ (1/9) (w / 2M)] - w, else M. w = the loop's blocking time per save, M = the job's mean
time between failures. The expected share of time lost to checkpoints and re-done work at
interval tau is w / tau + tau / (2 M) (first order), which the advice compares.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Hashable
from dataclasses import dataclass
from itertools import pairwise

ROUGH_BELOW = 3  # failures: an MTBF from fewer is a rough estimate


@dataclass(frozen=True)
class IntervalAdvice:
    mtbf_s: float | None  # running time per failure; None before the first failure
    blocking_s: float | None  # median loop blocking per save
    current_s: float | None  # median time between saves now
    optimal_s: float | None  # Daly's interval
    loss_now: float | None  # expected share of time lost at the current interval
    loss_optimal: float | None  # ... at the optimal one
    failures: int = 0  # the failures the MTBF is from (a few make it a rough one)

    def rough(self) -> str:
        """What an MTBF from few failures is worth, said beside the advice ('' from
        ROUGH_BELOW failures on; walk-through 42 #13: one failure in a 60 s run advised
        saving every 0.4 s with no word of doubt)."""
        if not 0 < self.failures < ROUGH_BELOW:
            return ""
        return (f" (an MTBF from {self.failures} failure{'s' if self.failures > 1 else ''} "
                "only: a rough guide until more are seen)")

    def to_dict(self) -> dict[str, float | None]:
        return {k: None if v is None else round(v, 4) for k, v in self.__dict__.items()}


def daly(w: float, m: float) -> float:
    """Daly's optimal checkpoint interval for blocking time w and MTBF m (seconds)."""
    if w <= 0 or m <= 0:
        raise ValueError("blocking time and MTBF must be positive")
    if w >= 2 * m:
        return m
    r = w / (2 * m)
    return math.sqrt(2 * w * m) * (1 + math.sqrt(r) / 3 + r / 9) - w


def expected_loss(tau: float, w: float, m: float) -> float:
    """First-order share of time lost to saves (w / tau) and to re-done work (tau / 2M)."""
    return w / tau + tau / (2 * m)


def advise(running_s: float, failures: int, save_times: list[tuple[Hashable, float]],
           blocking: list[float]) -> IntervalAdvice:
    """`running_s`: time the job ran (wall minus queued); `save_times`: (stretch, epoch
    seconds) of the loop's saves: the interval is the median gap between two saves of one
    stretch of training (a gap across a failure and its recovery is no interval the loop
    chose);
    `blocking`: each save's blocking seconds."""
    mtbf = running_s / failures if failures and running_s > 0 else None
    w = statistics.median(blocking) if blocking else None
    gaps = [b - a for (ka, a), (kb, b) in pairwise(sorted(save_times, key=lambda s: s[1]))
            if b > a and ka == kb]
    current = statistics.median(gaps) if gaps else None
    if mtbf is None or w is None or w <= 0:
        return IntervalAdvice(mtbf, w, current, None, None, None, failures)
    opt = daly(w, mtbf)
    now = expected_loss(current, w, mtbf) if current else None
    return IntervalAdvice(mtbf, w, current, opt, now, expected_loss(opt, w, mtbf), failures)
