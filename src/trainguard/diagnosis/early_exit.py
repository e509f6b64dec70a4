"""A rank that ended its script (exit 0) while its peers still trained: they fail next in a
collective that waits for it (gloo's `Connection closed by peer`, NCCL's remote peer gone or
a watchdog timeout), which reads as the network's fault and a restart that helps. Pure.

The cause is the script's: the rank's loop ran out first (fewer batches than its peers:
data not split evenly, `drop_last` off, a rank-dependent `break` or `return`), and it does so
again on every attempt (walk-through 21: each of four attempts diagnosed
`network_or_rendezvous`, restart `yes`, until the no-progress guard gave up). So when the
verdict is such a symptom and a rank exited 0 before the first rank that failed, the verdict
is that rank's early end, the peers' line its evidence. At a normal end of training (every
rank done, one exiting first, a peer failing in its teardown) the same holds, less the uneven
data: the script ends its ranks unalike, and a restart ends the same way; the advice says both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from trainguard.diagnosis.candidates import RankExit
from trainguard.diagnosis.taxonomy import Category, Culprit, Diagnosis, FaultDomain, RestartHelps

# what peers print when one of them is gone
PEER_SYMPTOMS = frozenset({Category.NETWORK_OR_RENDEZVOUS, Category.NCCL_COMMUNICATION_ERROR,
                           Category.NCCL_TIMEOUT_OR_HANG})
ADVICE = ("Every rank must run the same number of steps and collectives: split the data "
          "evenly (DistributedSampler with drop_last=True, or the same number of batches per "
          "rank), avoid a rank-dependent break or return in the loop, or wrap uneven loops "
          "in torch.distributed.algorithms.Join. If every rank had finished training, the "
          "peers failed in their teardown instead: end every rank alike (a barrier, then "
          "torch.distributed.destroy_process_group()). A restart ends the same way.")


def ended_before_failure(exits: Sequence[RankExit], which: Callable[[RankExit], bool]
                         ) -> list[RankExit]:
    """The ranks `which` picks that ended, not failed, before the first failed rank (the
    launcher stops the others only after it), the earliest first."""
    failed = [e.ended_at for e in exits if e.failed and e.ended_at is not None]
    if not failed:
        return []
    return sorted((e for e in exits if not e.failed and which(e) and e.ended_at is not None
                   and e.ended_at < min(failed)), key=lambda e: (e.ended_at, e.rank))


def exited_early(e: RankExit) -> bool:
    """Exited 0 by itself (not stopped: a SIGTERM handler may exit 0 too; review 53 #1)."""
    return not e.stopped and e.returncode == 0


def early_exit(d: Diagnosis | None, exits: Sequence[RankExit]) -> Diagnosis | None:
    """`d`, or the early end of a rank that exited 0 before the first failed rank when `d`
    is what its peers print about it."""
    early = ended_before_failure(exits, exited_early)
    return early_verdict(d, early, exits) if early and d is not None and \
        is_peer_symptom(d) else d


def is_peer_symptom(d: Diagnosis) -> bool:
    """What peers print when one of them is gone."""
    return d.category in PEER_SYMPTOMS


def early_verdict(d: Diagnosis, early: list[RankExit], exits: Sequence[RankExit]
                  ) -> Diagnosis:
    """The peers' symptom `d` blamed on the ranks `early` that ended their script first."""
    return blamed_first(
        d, early, Category.USER_CODE_ERROR, FaultDomain.USER_CODE, RestartHelps.NO,
        "rank_exited_early", ADVICE, 0.7,
        f"rank(s) {', '.join(str(e.rank) for e in early)} ended the script (exit 0) before "
        f"rank(s) {failed_ranks(exits)}, which then failed in a collective or store call "
        f"that waited for it ({d.summary.rstrip('.')})")


def failed_ranks(exits: Sequence[RankExit]) -> str:
    return ", ".join(map(str, sorted({e.rank for e in exits if e.failed})))


def blamed_first(d: Diagnosis, ranks: list[RankExit], category: Category,
                 domain: FaultDomain, restart: RestartHelps, subcategory: str, advice: str,
                 confidence: float, summary: str) -> Diagnosis:
    """The peers' symptom `d` as the verdict of the ranks that ended first (the earliest
    the culprit, its node not isolated), at most `confidence` sure."""
    return replace(d, category=category, fault_domain=domain, restart_helps=restart,
                   subcategory=subcategory, summary=summary, advice=advice,
                   culprit=Culprit(ranks[0].rank, ranks[0].node), isolate_node=False,
                   confidence=min(d.confidence, confidence), rule=None)
