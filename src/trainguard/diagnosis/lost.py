"""A node-loss attempt's diagnosis, from the launcher's own record of the loss. Pure.

When a node is lost (its agent ended, disconnected or went silent; Slurm says it is down),
its ranks die with it and the ranks on healthy nodes fail or are stopped as a consequence:
their lines ("Connection reset by peer", a SIGTERM) are symptoms. The controller recorded
the loss (a recover record of fault scenario node_fault, related task `node/NAME`); this
turns it into the Diagnosis a crash gets, the lost node as the culprit.
"""

from __future__ import annotations

from trainguard.diagnosis.taxonomy import (
    Category,
    Culprit,
    Diagnosis,
    Evidence,
    FaultDomain,
    RestartHelps,
)
from trainguard.records import rank_list

NODE_TASK_PREFIX = "node/"


def lost_node(related_task: str | None) -> str | None:
    """`node/node-1` -> `node-1`; None for a task that is not a node."""
    if related_task is None or not related_task.startswith(NODE_TASK_PREFIX):
        return None
    return related_task.removeprefix(NODE_TASK_PREFIX) or None


def node_loss_diagnosis(node: str, reason: str, ranks: list[int],
                        logs: Diagnosis | None, not_blamed: str | None = None) -> Diagnosis:
    """`reason`: the controller's words for the loss; `ranks`: the lost node's ranks;
    `logs`: what the attempt's logs and exits say, which the loss explains; `not_blamed`:
    why the node is not at fault, when it is not (the cluster ended its agent's step, every
    link went down at once: it was not drained, and is not to be isolated; review 52 #3)."""
    symptoms: tuple[Evidence, ...] = ()
    if logs is not None:
        first = logs.evidence or Evidence("", 0, logs.summary, logs.culprit_rank)
        symptoms = (first, *logs.symptoms)
    advice = (f"The node, not the training script, failed: check its agent's log "
              f"(JOB_DIR/cluster/{node}.agent.log) and the machine (power, network, kernel "
              "log, Slurm's reason); the job kept it out of its placement." if not_blamed is None
              else f"The node is not blamed: {not_blamed}; it was not drained. Check the "
              "cluster's own record (a requeue, a time limit, an outage of the network the "
              "controller is on).")
    return Diagnosis(
        Category.OTHER, FaultDomain.INFRASTRUCTURE, RestartHelps.YES,
        loss_summary(node, reason, ranks),
        f"{advice} Errors on the other nodes are its consequences.",
        Culprit(min(ranks) if ranks else None, node), None, symptoms[:10],
        not_blamed is None, 0.9, "node_lost", None, from_log=False)


def loss_summary(node: str, reason: str, ranks: list[int]) -> str:
    """How `node` was lost (`reason`: the controller's words) and which ranks ran there."""
    on = f" (rank(s) {rank_list(ranks)} ran there)" if ranks else ""
    return f"{reason if node in reason else f'node {node} was lost: {reason}'}{on}"
