"""The node-level ladder (pure): pod-level for a lost node, isolated job-level for a faulty
one, downgrade / quotaExceeded on the way, repeat offenders."""

from __future__ import annotations

from trainguard.policy.nodes import (
    LadderHistory,
    LadderPolicy,
    Rung,
    Trigger,
    implicate,
    is_repeat_offender,
    plan,
)
from trainguard.records import RecoverResult

POL = LadderPolicy(max_pod_reschedules=2, max_job_reschedules=2, repeat_offender_count=3,
                   repeat_window_s=100)
PLACED = ("a", "b")


def test_a_lost_node_is_replaced_by_a_spare_in_its_own_slot_only() -> None:
    p = plan(Trigger.LOST, "b", "was lost", PLACED, ("c",), LadderHistory(), POL)
    assert p.rung == Rung.POD_RESCHEDULE and p.placement == ("a", "c")
    assert p.moved_slots == (1,) and p.tried == () and p.missing == 0
    assert p.history.pod_used == 1 and p.history.job_used == 0
    assert "spare c" in p.reason


def test_without_a_spare_pod_level_downgrades_to_job_level_which_waits_for_a_node() -> None:
    p = plan(Trigger.LOST, "b", "was lost", PLACED, (), LadderHistory(), POL)
    assert [(t.rung, t.result) for t in p.tried] == [(Rung.POD_RESCHEDULE,
                                                      RecoverResult.DOWNGRADE)]
    assert p.rung == Rung.JOB_RESCHEDULE and p.missing == 1 and p.placement == ("a",)


def test_a_spent_pod_budget_is_quota_exceeded_and_job_level_places_every_rank_again() -> None:
    p = plan(Trigger.LOST, "a", "was lost", PLACED, ("c",), LadderHistory(pod_used=2), POL)
    assert [(t.rung, t.result) for t in p.tried] == [(Rung.POD_RESCHEDULE,
                                                      RecoverResult.QUOTA_EXCEEDED)]
    assert p.rung == Rung.JOB_RESCHEDULE and p.placement == ("b", "c")
    assert p.moved_slots == (0, 1) and p.history.job_used == 1


def test_a_faulty_node_goes_straight_to_isolated_job_level() -> None:
    p = plan(Trigger.FAULTY, "a", "is faulty", PLACED, ("c", "d"), LadderHistory(), POL)
    assert p.rung == Rung.JOB_RESCHEDULE and p.tried == ()
    assert p.placement == ("b", "c") and p.missing == 0


def test_when_every_rung_is_spent_the_plan_gives_up_with_quota_exceeded() -> None:
    hist = LadderHistory(pod_used=2, job_used=2)
    p = plan(Trigger.LOST, "a", "was lost", PLACED, ("c",), hist, POL)
    assert p.rung is None and p.result == RecoverResult.QUOTA_EXCEEDED
    assert [(t.rung, t.result) for t in p.tried] == [
        (Rung.POD_RESCHEDULE, RecoverResult.QUOTA_EXCEEDED),
        (Rung.JOB_RESCHEDULE, RecoverResult.QUOTA_EXCEEDED)]
    assert p.history == hist


def test_a_node_implicated_k_times_within_the_window_is_a_repeat_offender() -> None:
    h = LadderHistory()
    counts = []
    for t in (0.0, 10.0, 20.0):
        h, n = implicate(h, "a", t, POL)
        counts.append(n)
    assert counts == [1, 2, 3] and is_repeat_offender(3, POL)
    h, n = implicate(h, "b", 25.0, POL)
    assert n == 1 and not is_repeat_offender(n, POL)


def test_implications_older_than_the_window_are_forgotten() -> None:
    h = LadderHistory()
    for t in (0.0, 10.0):
        h, _ = implicate(h, "a", t, POL)
    h, n = implicate(h, "a", 150.0, POL)
    assert n == 1 and len(h.implicated) == 1


def test_repeat_offender_zero_turns_the_rule_off() -> None:
    assert not is_repeat_offender(99, LadderPolicy(repeat_offender_count=0))
