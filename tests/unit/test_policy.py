"""The restart policy: budget, conditional/unconditional, no-progress guard and backoff."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard.diagnosis.taxonomy import (
    Category,
    Culprit,
    Diagnosis,
    FaultDomain,
    RestartHelps,
)
from trainguard.exitcodes import ExitCode
from trainguard.policy.decision import (
    Action,
    Decision,
    HAPolicy,
    History,
    Incident,
    IncidentKind,
)
from trainguard.policy.ladder import decide as ladder_decide
from trainguard.policy.process import backoff
from trainguard.records import RecoverResult, StartType
from trainguard.spec import RestartPolicy


def diag(helps: RestartHelps = RestartHelps.YES, category: str = "host_oom") -> Diagnosis:
    return Diagnosis(Category(category), FaultDomain.INFRASTRUCTURE, helps,
                     f"rank 0: {category}", "advice", Culprit(0))


USER_BUG = diag(RestartHelps.NO, "user_code_error")
KILLED = diag(RestartHelps.YES)


def decide(d: Diagnosis, progressed: bool, hist: History, pol: RestartPolicy) -> Decision:
    """A single-node crash through the whole ladder: only rung 1 can answer it."""
    return ladder_decide(Incident(IncidentKind.CRASH, made_progress=progressed, diagnosis=d),
                         hist, HAPolicy(restart=pol))


RESTART, FAIL, NO_PROGRESS = "restart", "fail", "no_progress"


def outcome(d: Decision) -> str:
    if d.action == Action.RESTART:
        return RESTART
    assert d.action == Action.GIVE_UP
    return NO_PROGRESS if d.exit_code == ExitCode.NO_PROGRESS else FAIL


def run(pol: RestartPolicy, attempts: Iterable[tuple[Diagnosis, bool]]) -> list[Decision]:
    """Feed failed attempts to decide() as the controller does; stop at the first non-restart."""
    hist, out = History(), []
    for d, progressed in attempts:
        dec = decide(d, progressed, hist, pol)
        out.append(dec)
        hist = dec.history
        if dec.action != Action.RESTART:
            break
    return out


def actions(decisions: list[Decision]) -> list[str]:
    return [outcome(d) for d in decisions]


# --- on / off and the budget -------------------------------------------------------------


def test_auto_restart_is_off_when_max_restarts_is_zero() -> None:
    dec = decide(KILLED, True, History(), RestartPolicy(max_restarts=0))
    assert outcome(dec) == FAIL
    assert dec.result == RecoverResult.TERMINATED
    assert "--max-restarts 0" in dec.reason


def test_a_restartable_failure_is_restarted_as_an_auto_restart() -> None:
    dec = decide(KILLED, True, History(), RestartPolicy(max_restarts=3))
    assert dec.action == Action.RESTART
    assert dec.start_type == StartType.AUTO_RESTART
    assert dec.result == RecoverResult.RECOVERING
    assert dec.history.restarts_used == 1


def test_maybe_counts_as_restartable_for_the_conditional_policy() -> None:
    dec = decide(diag(RestartHelps.MAYBE), True, History(), RestartPolicy(max_restarts=3))
    assert dec.action == Action.RESTART


def test_every_restart_spends_one_of_the_budget_until_it_is_gone() -> None:
    pol = RestartPolicy(max_restarts=3, no_progress_limit=100)
    decisions = run(pol, [(KILLED, True)] * 10)
    assert actions(decisions) == [RESTART] * 3 + [FAIL]
    assert decisions[-1].result == RecoverResult.QUOTA_EXCEEDED
    assert "budget" in decisions[-1].reason


# --- conditional and unconditional -------------------------------------------------------


def test_the_conditional_policy_refuses_a_failure_a_restart_does_not_fix() -> None:
    dec = decide(USER_BUG, True, History(), RestartPolicy(max_restarts=5))
    assert outcome(dec) == FAIL
    assert "user_code_error" in dec.reason
    assert "--unconditional-restart" in dec.reason
    assert dec.history.restarts_used == 0


def test_the_unconditional_policy_restarts_a_user_bug_as_an_unconditional_restart() -> None:
    dec = decide(USER_BUG, True, History(), RestartPolicy(max_restarts=5, unconditional=True))
    assert dec.action == Action.RESTART
    assert dec.start_type == StartType.UNCONDITIONAL_RESTART


def test_the_unconditional_policy_still_calls_a_restartable_failure_an_auto_restart() -> None:
    dec = decide(KILLED, True, History(), RestartPolicy(max_restarts=5, unconditional=True))
    assert dec.start_type == StartType.AUTO_RESTART


def test_unconditional_restarts_stop_after_three_in_a_row() -> None:
    pol = RestartPolicy(max_restarts=50, unconditional=True, no_progress_limit=100)
    decisions = run(pol, [(USER_BUG, False)] * 10)
    assert actions(decisions) == [RESTART] * 3 + [FAIL]
    assert decisions[-1].result == RecoverResult.QUOTA_EXCEEDED
    assert "3 unconditional restarts in a row" in decisions[-1].reason


def test_the_unconditional_counter_resets_after_an_attempt_that_made_progress() -> None:
    pol = RestartPolicy(max_restarts=50, unconditional=True, no_progress_limit=100)
    seq = [(USER_BUG, False)] * 3 + [(USER_BUG, True)] + [(USER_BUG, False)] * 2
    decisions = run(pol, seq)
    assert actions(decisions) == [RESTART] * 6
    assert decisions[-1].history.consecutive_unconditional == 3


def test_restartable_failures_do_not_count_towards_the_unconditional_limit() -> None:
    pol = RestartPolicy(max_restarts=50, unconditional=True, no_progress_limit=100)
    seq = [(USER_BUG, False), (KILLED, False)] * 3
    decisions = run(pol, seq)
    assert actions(decisions) == [RESTART] * 6
    assert decisions[-1].history.consecutive_unconditional == 3


def test_the_unconditional_limit_follows_the_policy() -> None:
    pol = RestartPolicy(max_restarts=50, unconditional=True, unconditional_max_consecutive=1,
                        no_progress_limit=100)
    assert actions(run(pol, [(USER_BUG, False)] * 3)) == [RESTART, FAIL]


# --- the no-progress guard ---------------------------------------------------------------


def test_attempts_without_progress_give_up_after_the_limit() -> None:
    pol = RestartPolicy(max_restarts=100, no_progress_limit=3)
    decisions = run(pol, [(KILLED, False)] * 10)
    assert actions(decisions) == [RESTART] * 2 + [NO_PROGRESS]
    assert "3 runs in a row (attempts or in-process restarts) made no progress" in \
        decisions[-1].reason


def test_one_attempt_with_progress_resets_the_no_progress_count() -> None:
    pol = RestartPolicy(max_restarts=100, no_progress_limit=3)
    seq = [(KILLED, False)] * 2 + [(KILLED, True)] + [(KILLED, False)] * 3
    assert actions(run(pol, seq)) == [RESTART] * 5 + [NO_PROGRESS]


def test_the_no_progress_guard_comes_before_the_conditional_verdict() -> None:
    dec = decide(USER_BUG, False, History(attempts_without_progress=2),
                 RestartPolicy(max_restarts=5, no_progress_limit=3))
    assert outcome(dec) == NO_PROGRESS


# --- backoff ------------------------------------------------------------------------------


def test_backoff_doubles_with_each_failure_in_a_row_and_caps() -> None:
    pol = RestartPolicy(max_restarts=100, backoff_s=1.0, backoff_max_s=10.0,
                        no_progress_limit=100)
    delays = [d.delay_s for d in run(pol, [(KILLED, False)] * 7)]
    assert delays == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0]


def test_backoff_starts_over_after_an_attempt_with_progress() -> None:
    pol = RestartPolicy(max_restarts=100, backoff_s=2.0, backoff_max_s=100.0,
                        no_progress_limit=100)
    seq = [(KILLED, False)] * 3 + [(KILLED, True), (KILLED, False)]
    assert [d.delay_s for d in run(pol, seq)] == [2.0, 4.0, 8.0, 2.0, 4.0]


def test_backoff_zero_means_no_delay() -> None:
    pol = RestartPolicy(max_restarts=10, backoff_s=0.0, backoff_max_s=0.0)
    assert [d.delay_s for d in run(pol, [(KILLED, True)] * 3)] == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("n", [0, 1, 40, 10_000])
def test_backoff_never_overflows_and_stays_within_the_cap(n: int) -> None:
    pol = RestartPolicy(backoff_s=3.0, backoff_max_s=300.0)
    assert 0 <= backoff(n, pol) <= 300.0


# --- property -----------------------------------------------------------------------------


@st.composite
def policies(draw: st.DrawFn) -> RestartPolicy:
    backoff_s = draw(st.floats(0, 3600, allow_nan=False))
    return RestartPolicy(
        max_restarts=draw(st.integers(0, 20)),
        unconditional=draw(st.booleans()),
        unconditional_max_consecutive=draw(st.integers(1, 3)),
        backoff_s=backoff_s,
        backoff_max_s=draw(st.floats(backoff_s, 86400, allow_nan=False)),
        no_progress_limit=draw(st.integers(1, 128)),
    )


attempt_seq = st.lists(
    st.tuples(st.sampled_from(list(RestartHelps)), st.booleans()), max_size=60)


@settings(max_examples=150, deadline=None)
@given(pol=policies(), seq=attempt_seq)
def test_restarts_never_exceed_the_budget_and_delays_stay_within_bounds(
    pol: RestartPolicy, seq: list[tuple[RestartHelps, bool]]
) -> None:
    hist, restarts = History(), 0
    for helps, progressed in seq:  # keep feeding even past a FAIL: the budget must still hold
        dec = decide(diag(helps), progressed, hist, pol)
        hist = dec.history
        assert 0.0 <= dec.delay_s <= pol.backoff_max_s
        if dec.action == Action.RESTART:
            restarts += 1
            assert dec.start_type is not None
        else:
            assert dec.start_type is None
        assert restarts <= pol.max_restarts
        assert hist.restarts_used == restarts


@pytest.mark.parametrize("pol", [RestartPolicy(max_restarts=0),
                                 RestartPolicy(max_restarts=5, unconditional=True)])
def test_a_program_that_could_not_start_gives_up_at_once_with_the_usage_exit_code(
    pol: RestartPolicy,
) -> None:
    from dataclasses import replace

    from trainguard.diagnosis.taxonomy import NOT_STARTED

    not_started = replace(diag(RestartHelps.NO, "dependency_or_import_error"),
                          subcategory=NOT_STARTED)
    d = decide(not_started, False, History(), pol)
    assert (d.action, d.exit_code) == (Action.GIVE_UP, ExitCode.USAGE)
    assert "could not start" in d.reason


def test_the_rules_file_marks_a_program_that_could_not_start_with_the_shared_name() -> None:
    from trainguard.diagnosis.rules import load_rules
    from trainguard.diagnosis.taxonomy import NOT_STARTED

    rule = load_rules().match("/usr/bin/python3: No module named nosuchmod")
    assert rule is not None and rule.subcategory == NOT_STARTED
