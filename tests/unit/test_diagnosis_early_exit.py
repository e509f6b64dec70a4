"""diagnosis/early_exit.py: peers failing after a rank ended its script first (pure)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from trainguard.diagnosis.candidates import RankExit
from trainguard.diagnosis.early_exit import early_exit
from trainguard.diagnosis.taxonomy import Category, Diagnosis, FaultDomain, RestartHelps

T0 = datetime(2026, 12, 4, 23, 0, tzinfo=timezone.utc)


def peers_gone(category: Category = Category.NETWORK_OR_RENDEZVOUS) -> Diagnosis:
    return Diagnosis(category, FaultDomain.NETWORK, RestartHelps.YES,
                     "rank 0: RuntimeError: Connection reset by peer", "Restart.",
                     confidence=0.45, subcategory="peer_gone")


def exits(early_s: float, failed_s: float) -> list[RankExit]:
    return [RankExit(1, False, 0, T0 + timedelta(seconds=early_s)),
            RankExit(0, True, 1, T0 + timedelta(seconds=failed_s))]


def test_a_rank_that_exited_0_before_its_peer_failed_is_the_cause() -> None:
    for category in (Category.NETWORK_OR_RENDEZVOUS, Category.NCCL_COMMUNICATION_ERROR,
                     Category.NCCL_TIMEOUT_OR_HANG):
        d = early_exit(peers_gone(category), exits(1.0, 2.0))
        assert d is not None
        assert (d.category, d.subcategory, d.restart_helps, d.culprit.rank) == (
            Category.USER_CODE_ERROR, "rank_exited_early", RestartHelps.NO, 1)
        assert "Connection reset by peer" in d.summary and "drop_last" in d.advice


def test_nothing_changes_otherwise() -> None:
    d = peers_gone()
    assert early_exit(d, exits(3.0, 2.0)) is d  # it ended after the failure (a teardown)
    assert early_exit(d, [RankExit(0, True, 1, T0)]) is d  # no rank ended well
    assert early_exit(d, [RankExit(1, False, 0, None), RankExit(0, True, 1, T0)]) is d
    oom = Diagnosis(Category.GPU_OOM, FaultDomain.USER_CODE, RestartHelps.NO, "oom", "x")
    assert early_exit(oom, exits(1.0, 2.0)) is oom  # a cause of its own stays
    assert early_exit(None, exits(1.0, 2.0)) is None
