"""diagnosis/stopped_first.py: peers failing after ranks were stopped from outside (pure)."""

from __future__ import annotations

import signal
from datetime import datetime, timedelta, timezone

from trainguard.diagnosis.candidates import RankExit
from trainguard.diagnosis.stopped_first import SUBCATEGORY, stopped_first
from trainguard.diagnosis.taxonomy import Category, Diagnosis, FaultDomain, RestartHelps

T0 = datetime(2026, 12, 7, 15, 5, tzinfo=timezone.utc)
GLOO = "rank 1: RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:30893"


def peers_gone(category: Category = Category.NCCL_COMMUNICATION_ERROR) -> Diagnosis:
    return Diagnosis(category, FaultDomain.NETWORK, RestartHelps.YES, GLOO, "Restart.",
                     confidence=0.9)


def exits(code: int, stopped_s: float, failed_s: float) -> list[RankExit]:
    """node-1's ranks 2, 3 stopped (`code`) at `stopped_s`, rank 1 of node-0 failed after."""
    at = T0 + timedelta(seconds=stopped_s)
    return [RankExit(3, False, code, at + timedelta(seconds=0.1), node="node-1"),
            RankExit(2, False, code, at, node="node-1"),
            RankExit(1, True, 1, T0 + timedelta(seconds=failed_s), node="node-0"),
            RankExit(0, False, -signal.SIGTERM, T0 + timedelta(seconds=failed_s + 1),
                     node="node-0")]  # stopped by the launcher after the failure


def test_ranks_stopped_on_sigterm_before_a_peer_failed_are_the_cause() -> None:
    for category in (Category.NETWORK_OR_RENDEZVOUS, Category.NCCL_COMMUNICATION_ERROR,
                     Category.NCCL_TIMEOUT_OR_HANG):
        for code in (143, -signal.SIGTERM):  # a handler's exit or the signal's default
            d = stopped_first(peers_gone(category), exits(code, 1.0, 2.0))
            assert d is not None
            assert (d.category, d.subcategory, d.restart_helps, d.culprit.rank,
                    d.culprit.node, d.isolate_node) == (
                Category.KILLED_BY_SIGNAL_UNKNOWN, SUBCATEGORY, RestartHelps.YES, 2, "node-1",
                False)
            assert d.summary.startswith("rank(s) 2, 3 (node node-1) were stopped by a SIGTERM "
                                        "from outside the launcher before rank(s) 1,")
            assert "Connection closed by peer" in d.summary and "agent's log" in d.advice


def test_nothing_changes_otherwise() -> None:
    d = peers_gone()
    assert stopped_first(d, exits(143, 3.0, 2.0)) is d  # stopped after the failure
    assert stopped_first(d, exits(1, 1.0, 2.0)) is d  # not a SIGTERM's exit
    assert stopped_first(d, exits(-signal.SIGKILL, 1.0, 2.0)) is d
    assert stopped_first(d, [RankExit(2, False, 143, None), RankExit(1, True, 1, T0)]) is d
    oom = Diagnosis(Category.GPU_OOM, FaultDomain.USER_CODE, RestartHelps.NO, "oom", "x")
    assert stopped_first(oom, exits(143, 1.0, 2.0)) is oom  # a cause of its own stays
    assert stopped_first(None, exits(143, 1.0, 2.0)) is None
