"""Rung 0, step re-execution (the platform's operator re-execution): every rank discards the
failed step, re-forms the process group in the same processes and runs the step again. Pure.

Budgets: `step_retries` re-executions of one step (the platform's default is one retry per
operator) and `max_step_retries` in the whole job. A rung that cannot act (off, a budget
spent) downgrades: the ranks raise the step's error, and their exit is the next rung's
incident (a process restart, decided by the restart policy).
"""

from __future__ import annotations

from dataclasses import replace

from trainguard.policy.decision import Action, Decision, HAPolicy, History, Rung, Tried
from trainguard.records import RecoverResult, rank_list


def reports_within_s(step_retry_timeout_s: float) -> float:
    """How long after the first report of a failed step a running rank that has not reported
    it is taken for blocked in the broken collective (gloo wakes a rank only when a
    connection it waits on closes: with 4 ranks one may wait on a live peer that waits for
    the verdict; a re-formed group's rendezvous would wait for it and fail, review 37 #2).
    Half of --step-retry-timeout, the time the reporting ranks wait for the verdict: a rank
    that is only slow (a long step, a data loader's stall) reaches the broken collective and
    reports within it (review 38 #1: a 1 s window gave up a step whose peer came 3 s late,
    and the job failed where it had re-executed the step)."""
    return step_retry_timeout_s / 2


def after_step_failure(step: int, hist: History, pol: HAPolicy,
                       ended_ranks: tuple[int, ...] = (), stale_group: bool = False,
                       silent_ranks: tuple[int, ...] = ()) -> Decision:
    """Re-execute `step`, or downgrade to the next rung (with why). `silent_ranks`: running
    ranks that did not report the failure within reports_within_s."""
    if not pol.operator_reexecution:
        return _downgrade("operator re-execution is off (--operator-reexecution)", hist,
                          RecoverResult.DOWNGRADE)
    if stale_group:  # one rank committed a step its peers are re-executing
        return _downgrade(f"step {step} failed on an older process group than the one the "
                          "other ranks re-formed: the ranks disagree on the step", hist,
                          RecoverResult.DOWNGRADE)
    if ended_ranks:
        return _downgrade(f"the process of rank(s) {rank_list(ended_ranks)} ended: a "
                          "re-formed group cannot include it", hist, RecoverResult.DOWNGRADE)
    if silent_ranks:
        return _downgrade(f"rank(s) {rank_list(silent_ranks)} did not report step {step}'s "
                          "failure within half of --step-retry-timeout (blocked in the broken "
                          "collective): a re-formed group cannot include it", hist,
                          RecoverResult.DOWNGRADE)
    tries = hist.retried_step_count if hist.retried_step == step else 0
    if tries >= pol.step_retries:
        return _downgrade(f"step {step} was re-executed {tries} time(s) and failed again "
                          f"(--step-retries {pol.step_retries})", hist,
                          RecoverResult.QUOTA_EXCEEDED)
    if hist.step_retries >= pol.max_step_retries:
        return _downgrade(f"the job's step re-execution budget is spent "
                          f"({pol.max_step_retries}, --max-step-retries)", hist,
                          RecoverResult.QUOTA_EXCEEDED)
    h = replace(hist, step_retries=hist.step_retries + 1, retried_step=step,
                retried_step_count=tries + 1)
    return Decision(Action.REEXECUTE,
                    f"re-executing step {step} ({tries + 1}/{pol.step_retries} for this step, "
                    f"{h.step_retries}/{pol.max_step_retries} in the job)", h,
                    rung=Rung.STEP_REEXECUTION)


def _downgrade(why: str, hist: History, result: RecoverResult) -> Decision:
    return Decision(Action.DOWNGRADE, why, hist, result=result,
                    tried=(Tried(Rung.STEP_REEXECUTION, result, why),))
