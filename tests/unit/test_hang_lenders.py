"""hang/lenders.py against the rule it replaced, a scan of every phased rank for each rank
(review 34 #7: O(N^2) a poll while every rank saves): the same lender for random polls."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pytest

from trainguard.hang.lenders import Lenders
from trainguard.protocol import RankLiveness
from trainguard.worker.contract import CHECKPOINT_PHASE

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def scan(phased: list[RankLiveness], left: datetime | None, threshold: float,
         allowance: dict[int, float]) -> RankLiveness | None:
    """The rule as detector.py had it: every phased rank but a checkpoint phase that began
    more than `threshold` after this rank left a phase; the longest allowance, the first
    among equals."""
    lent = [q for q in phased if q.phase != CHECKPOINT_PHASE or (
        left is not None and q.phase_since is not None
        and (q.phase_since - left).total_seconds() <= threshold)]
    return max(lent, key=lambda q: allowance[q.rank]) if lent else None


@pytest.mark.parametrize("seed", range(40))
def test_the_lender_is_the_one_the_scan_of_every_phased_rank_finds(seed: int) -> None:
    rng = random.Random(seed)
    phased = []
    for rank in range(rng.randint(0, 30)):
        phase = rng.choice([CHECKPOINT_PHASE, CHECKPOINT_PHASE, "eval", "compile"])
        since = None if rng.random() < 0.1 else T0 + timedelta(seconds=rng.randint(0, 60))
        phased.append(RankLiveness(rank=rank, phase=phase, phase_since=since,
                                   phase_timeout_s=rng.choice([None, 60.0, 600.0])))
    allowance = {q.rank: q.phase_timeout_s or 1800.0 for q in phased}
    lenders = Lenders(phased, lambda q: allowance[q.rank])
    for _ in range(30):
        left = None if rng.random() < 0.2 else T0 + timedelta(seconds=rng.randint(-20, 70))
        threshold = rng.choice([0.0, 5.0, 8.0, 30.0])
        assert lenders.lender(left, threshold) is scan(phased, left, threshold, allowance)


def test_a_save_lends_only_to_a_rank_that_did_its_part_first() -> None:
    saving = RankLiveness(rank=0, phase=CHECKPOINT_PHASE, phase_since=T0)
    lenders = Lenders([saving], lambda q: 1800.0)
    assert lenders.lender(T0 - timedelta(seconds=3), 8.0) is saving  # left its part 3 s before
    assert lenders.lender(T0 - timedelta(seconds=9), 8.0) is None  # long before: not its save
    assert lenders.lender(None, 8.0) is None  # never in a phase this attempt
