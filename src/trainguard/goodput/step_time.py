"""The ideal step time of a job: what a step takes when nothing goes wrong. Pure."""

from __future__ import annotations


def ideal_step_s(weighted: list[tuple[int, float]]) -> float | None:
    """The ideal step time: the mean of step times up to median + 3·MAD (weighted by steps),
    as ml-goodput-measurement computes it, without its 1 s floor."""
    if not weighted:
        return None
    med = _weighted_median(weighted)
    mad = _weighted_median([(n, abs(d - med)) for n, d in weighted])
    kept = [(n, d) for n, d in weighted if d <= med + 3 * mad]
    return round(sum(n * d for n, d in kept) / sum(n for n, _ in kept), 6)


def _weighted_median(weighted: list[tuple[int, float]]) -> float:
    items = sorted(weighted, key=lambda x: x[1])
    half = sum(n for n, _ in items) / 2
    seen = 0
    for n, d in items:
        seen += n
        if seen >= half:
            return d
    return items[-1][1]
