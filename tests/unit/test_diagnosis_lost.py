"""diagnosis/lost.py and diagnosis/attempt.py's diagnose_node_loss: a node loss's verdict (pure,
over worker facts as the agents report them)."""

from __future__ import annotations

from trainguard.backends.slurm_cli import srun_ended_why
from trainguard.diagnosis.attempt import diagnose_node_loss


def test_a_lost_node_is_the_culprit_and_is_blamed_unless_it_was_not_drained() -> None:
    d = diagnose_node_loss([], "n2", "its agent process ended", [2, 3])
    assert (d.category.value, d.subcategory, d.culprit.rank, d.culprit.node) == (
        "other", "node_lost", 2, "n2")
    assert d.isolate_node and d.restart_helps.value == "yes"
    assert d.summary == "node n2 was lost: its agent process ended (rank(s) 2, 3 ran there)"
    assert d.advice.startswith("The node, not the training script, failed")
    # review 52 #3: Slurm cancelled its step (a requeue): not drained, and not blamed either
    why = srun_ended_why("slurmstepd: error: *** STEP 14.2 ON n3 CANCELLED AT 2026-12-07T12:00:00"
                         " DUE TO JOB REQUEUE ***\n")
    kept = diagnose_node_loss([], "n3", why, [4], None, "the cluster ended its agent's step")
    assert not kept.isolate_node and kept.culprit.node == "n3"
    assert kept.advice.startswith("The node is not blamed: the cluster ended its agent's step; "
                                  "it was not drained."), kept.advice
