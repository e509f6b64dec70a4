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
    if d is None or d.category not in PEER_SYMPTOMS:
        return d
    early = ended_before_failure(exits, exited_early)
    if not early:
        return d
    first = early[0]
    who = ", ".join(str(e.rank) for e in early)
    left = sorted({e.rank for e in exits if e.failed})
    return replace(
        d, category=Category.USER_CODE_ERROR, fault_domain=FaultDomain.USER_CODE,
        restart_helps=RestartHelps.NO, subcategory="rank_exited_early",
        summary=(f"rank(s) {who} ended the script (exit 0) before rank(s) "
                 f"{', '.join(map(str, left))}, which then failed in a collective or store "
                 f"call that waited for it ({d.summary.rstrip('.')})"),
        advice=ADVICE, culprit=Culprit(first.rank, first.node), isolate_node=False,
        confidence=min(d.confidence, 0.7), rule=None)
