"""diagnosis/stopped_first.py: peers failing after ranks were stopped from outside (pure)."""

from __future__ import annotations

import signal
from datetime import datetime, timedelta, timezone

from trainguard.diagnosis.candidates import RankExit
from trainguard.diagnosis.stopped_first import SUBCATEGORY, ended_first, stopped_first
from trainguard.diagnosis.taxonomy import Category, Diagnosis, FaultDomain, RestartHelps

T0 = datetime(2026, 12, 7, 15, 5, tzinfo=timezone.utc)
GLOO = "rank 1: RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:30893"


def peers_gone(category: Category = Category.NCCL_COMMUNICATION_ERROR) -> Diagnosis:
    return Diagnosis(category, FaultDomain.NETWORK, RestartHelps.YES, GLOO, "Restart.",
                     confidence=0.9)


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def exits(code: int, stopped_s: float, failed_s: float, by: str | None = "outside"
          ) -> list[RankExit]:
    """node-1's ranks 2, 3 stopped (`code`, `by`) at `stopped_s`, rank 1 of node-0 failed
    after, rank 0 stopped by the launcher after the failure."""
    return [RankExit(3, False, code, at(stopped_s + 0.1), node="node-1", stopped=True,
                     stopped_by=by),
            RankExit(2, False, code, at(stopped_s), node="node-1", stopped=True, stopped_by=by),
            RankExit(1, True, 1, at(failed_s), node="node-0"),
            RankExit(0, False, -signal.SIGTERM, at(failed_s + 1), node="node-0",
                     stopped=True, stopped_by="launcher")]


def test_ranks_stopped_from_outside_before_a_peer_failed_are_the_cause() -> None:
    for category in (Category.NETWORK_OR_RENDEZVOUS, Category.NCCL_COMMUNICATION_ERROR,
                     Category.NCCL_TIMEOUT_OR_HANG):
        # a handler's 143, the signal's default, a handler's exit 0 (review 53 #1: read as
        # ranks that ended their script early, restart no), SIGKILL after the grace
        for code in (143, -signal.SIGTERM, 0, -signal.SIGKILL):
            d = ended_first(peers_gone(category), exits(code, 1.0, 2.0))
            assert d is not None
            assert (d.category, d.subcategory, d.restart_helps, d.culprit.rank,
                    d.culprit.node, d.isolate_node) == (
                Category.KILLED_BY_SIGNAL_UNKNOWN, SUBCATEGORY, RestartHelps.YES, 2, "node-1",
                False), code
            assert d.summary.startswith("rank(s) 2, 3 (node node-1) were stopped by a SIGTERM "
                                        "from outside the launcher before rank(s) 1 failed")
            assert "what the peers printed: rank 1: RuntimeError" in d.summary
            assert "agent's log" in d.advice


def test_nothing_changes_otherwise() -> None:
    d = peers_gone()
    assert stopped_first(d, exits(143, 3.0, 2.0)) is d  # stopped after the failure
    # the launcher's own stop, stamped before the failure by another node's clock (review 53
    # #4), and a store older than the record of who stopped a rank
    assert ended_first(d, exits(-signal.SIGTERM, 1.0, 2.0, by="launcher")) is d
    assert ended_first(d, exits(143, 1.0, 2.0, by=None)) is d
    assert stopped_first(d, [RankExit(2, False, 143, None, stopped=True, stopped_by="outside"),
                             RankExit(1, True, 1, T0)]) is d
    oom = Diagnosis(Category.GPU_OOM, FaultDomain.USER_CODE, RestartHelps.NO, "oom", "x")
    assert ended_first(oom, exits(143, 1.0, 2.0)) is oom  # a cause of its own stays
    assert ended_first(None, exits(143, 1.0, 2.0)) is None


def test_the_earlier_of_an_outside_stop_and_a_rank_s_early_end_is_the_cause() -> None:
    early = RankExit(4, False, 0, at(0.5), node="node-2")  # exited 0 by itself
    d = ended_first(peers_gone(), [*exits(143, 1.0, 2.0), early])
    assert d is not None and (d.subcategory, d.culprit.rank) == ("rank_exited_early", 4)
    late = RankExit(4, False, 0, at(1.5), node="node-2")
    d = ended_first(peers_gone(), [*exits(143, 1.0, 2.0), late])
    assert d is not None and (d.subcategory, d.culprit.rank) == (SUBCATEGORY, 2)
