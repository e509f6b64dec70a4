"""Rung 1a's judgement of the ranks waiting for a restart in place (pure): a broken group,
a rank blocked in the broken collective, a rank that ran on, a job that is ending.

Review 35 #7: with 4 ranks the `collective` fault broke the collective at once only on the
ranks connected to rank 1; rank 3 stayed blocked in its collective and never reported, the
three waiting ranks were refused after 5 s with "the other ranks run on" (rank 3 had made no
step) and the job restarted every process.
"""

from __future__ import annotations

from trainguard.policy.decision import (
    Action,
    HAPolicy,
    History,
    Incident,
    IncidentKind,
    InProcessCase,
    Rung,
)
from trainguard.policy.inprocess import (
    BLOCKED_AFTER_S,
    REFUSE_AFTER_S,
    GroupVerdict,
    judge_waiting,
)
from trainguard.policy.ladder import decide
from trainguard.spec import RestartPolicy
from trainguard.states import WorkerState

RUNNING = {r: WorkerState.RUNNING for r in range(4)}
AT_STEP_5 = {0: 5, 1: 5, 2: 5, 3: 5}
WAITING = {0: 100.0, 1: 100.02, 2: 100.03}  # rank -> when its report came (monotonic)


def test_every_rank_waiting_is_a_broken_group_at_once_with_no_rank_to_replace() -> None:
    assert judge_waiting(RUNNING, {**WAITING, 3: 100.05}, AT_STEP_5, (), 100.05, AT_STEP_5) == \
        GroupVerdict(broken=True)


def test_a_rank_with_no_step_since_the_failure_is_blocked_and_replaced_after_a_second() -> None:
    soon, due = 100.0 + BLOCKED_AFTER_S - 0.01, 100.0 + BLOCKED_AFTER_S
    assert judge_waiting(RUNNING, WAITING, AT_STEP_5, (), soon, AT_STEP_5) == \
        GroupVerdict()  # it may still see its own error
    assert judge_waiting(RUNNING, WAITING, AT_STEP_5, (), due, AT_STEP_5) == \
        GroupVerdict(broken=True, blocked=(3,))


def test_a_rank_that_reported_no_step_at_all_is_blocked_too() -> None:
    steps = {0: 5, 1: 5, 2: 5, 3: None}
    assert judge_waiting(RUNNING, WAITING, steps, (), 102.0, AT_STEP_5).blocked == (3,)
    assert judge_waiting(RUNNING, WAITING, {}, (), 102.0, AT_STEP_5).blocked == (3,)


def test_a_rank_that_ran_on_gets_the_waiting_ranks_refused_after_5s_saying_so() -> None:
    steps = {**AT_STEP_5, 3: 9}
    assert judge_waiting(RUNNING, WAITING, steps, (), 102.0, AT_STEP_5) == GroupVerdict()
    verdict = judge_waiting(RUNNING, WAITING, steps, (), 100.02 + REFUSE_AFTER_S, AT_STEP_5)
    assert not verdict.broken and verdict.refuse == (0, 1)  # rank 2 waited less than 5 s
    assert "rank(s) 3 ran on since the group failed (rank 3: step 5 -> 9)" in verdict.reason
    assert "the other ranks run on" not in verdict.reason  # what it said before: false


def test_one_rank_blocked_and_one_that_ran_on_is_not_a_broken_group() -> None:
    waiting = {0: 100.0, 1: 100.0}
    verdict = judge_waiting(RUNNING, waiting, {0: 5, 1: 5, 2: 5, 3: 7}, (), 106.0, AT_STEP_5)
    assert verdict == GroupVerdict(refuse=(0, 1), reason=verdict.reason)
    assert "rank(s) 3 ran on since the group failed (rank 3: step 5 -> 7)" in verdict.reason
    assert "rank 2" not in verdict.reason  # rank 2, blocked, is not named as running on


def test_ranks_told_no_restart_and_ending_are_not_blocked_ones() -> None:
    verdict = judge_waiting(RUNNING, {3: 100.0}, AT_STEP_5, (0, 1, 2), 102.0, AT_STEP_5)
    assert verdict == GroupVerdict()  # their exit is the incident
    verdict = judge_waiting(RUNNING, {3: 100.0}, AT_STEP_5, (0, 1, 2), 105.0, AT_STEP_5)
    assert verdict.refuse == (3,) and "rank(s) 0, 1, 2, told no restart, are ending" in \
        verdict.reason


def test_a_death_is_decided_elsewhere_and_an_exit_0_refuses_at_once() -> None:
    dead = {**RUNNING, 3: WorkerState.FAILED}
    assert judge_waiting(dead, WAITING, AT_STEP_5, (), 110.0, AT_STEP_5) == GroupVerdict()
    done = {**RUNNING, 3: WorkerState.SUCCEEDED}
    verdict = judge_waiting(done, WAITING, AT_STEP_5, (), 100.1, AT_STEP_5)
    assert verdict.refuse == (0, 1, 2) and "rank(s) 3 ended the script (exit 0)" in \
        verdict.reason
    assert judge_waiting(RUNNING, {}, AT_STEP_5, (), 110.0, AT_STEP_5) == GroupVerdict()


def test_a_blocked_rank_0_that_alone_prints_steps_is_blocked_not_running_on() -> None:
    """Review 37 #1: step lines on rank 0 only (the common logging idiom) and rank 0 the
    blocked rank: the waiting ranks have no step, rank 0 has step 5 from before the failure.
    Judged across ranks it "ran on" and the waiting ranks were refused after 5 s."""
    steps = {0: 5, 1: None, 2: None, 3: None}
    waiting = {1: 100.0, 2: 100.01, 3: 100.02}
    assert judge_waiting(RUNNING, waiting, steps, (), 101.0, steps) == \
        GroupVerdict(broken=True, blocked=(0,))


def test_a_rank_0_that_alone_prints_steps_and_really_runs_on_is_running_on() -> None:
    before = {0: 5, 1: None, 2: None, 3: None}
    waiting = {1: 100.0, 2: 100.01, 3: 100.02}
    now = {**before, 0: 6}  # its own step went up after the first report
    assert judge_waiting(RUNNING, waiting, now, (), 101.0, before) == GroupVerdict()
    verdict = judge_waiting(RUNNING, waiting, now, (), 100.0 + REFUSE_AFTER_S, before)
    assert not verdict.broken and verdict.refuse == (1,)
    assert "rank(s) 0 ran on since the group failed (rank 0: step 5 -> 6)" in verdict.reason
    first = judge_waiting(RUNNING, waiting, {**before, 0: 1}, (), 101.0,
                          {0: None, 1: None, 2: None, 3: None})
    assert first == GroupVerdict()  # a first step ever, made since: ran on, not blocked


def test_a_broken_group_with_a_blocked_rank_restarts_only_it_in_place() -> None:
    pol = HAPolicy(restart=RestartPolicy(max_restarts=3))
    d = decide(Incident(IncidentKind.GROUP_FAILED, why="Connection closed by peer",
                        in_process=InProcessCase((3,), (0, 1, 2))), History(), pol)
    assert (d.action, d.rung, d.ranks) == (Action.RESTART_RANKS, Rung.IN_PROCESS_RESTART, (3,))
    assert "only rank 3 starts again" in d.reason and "re-enter" in d.reason
