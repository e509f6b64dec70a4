"""Rung 1, restart the processes in place: after a crash (the restart policy) and after a
confirmed hang (restart upon suspension). Pure.

Rules (docs/restart-policy.md):
- auto restart is off when max_restarts == 0 (torchrun's default);
- a program that could not start (no module for -m): give up at once, exit 2 (usage);
- conditional (default): restart only when the diagnosis says a restart can help;
- unconditional: also restart what conditional would not, at most N consecutive;
- every restart spends one of max_restarts;
- an attempt that made progress resets the consecutive counters and the backoff;
- after `no_progress_limit` attempts in a row without progress: give up, do not requeue;
- a hang restarts in place without spending max_restarts, at most max_hang_restarts in a
  row (progress resets the count).
"""

from __future__ import annotations

from dataclasses import replace

from trainguard.diagnosis.taxonomy import NOT_STARTED, Diagnosis, RestartHelps
from trainguard.exitcodes import ExitCode
from trainguard.policy.decision import Action, Decision, HAPolicy, History, Rung
from trainguard.records import Reason, RecoverResult, StartType, plural
from trainguard.spec import RestartPolicy


def after_crash(diag: Diagnosis, made_progress: bool, hist: History,
                pol: RestartPolicy) -> Decision:
    """Restart in place or give up, after a failed attempt."""
    if diag.subcategory == NOT_STARTED:  # nothing ran: a usage error, as a bad flag
        return _give_up("the program could not start; a restart would fail the same way",
                        _after_attempt(hist, made_progress),
                        code=ExitCode.USAGE)
    why_not = None if diag.restart_helps != RestartHelps.NO else (
        f"{diag.category.value} in the {diag.fault_domain.value} domain will fail again")
    return _restart(diag.category.value, why_not, made_progress, hist, pol)


def after_group_failure(made_progress: bool, hist: History, pol: RestartPolicy) -> Decision:
    """Every rank's process group broke under it while every process lives (a transient
    collective error): a restart helps."""
    return _restart("a broken process group", None, made_progress, hist, pol)


def _restart(what: str, why_not: str | None, made_progress: bool, hist: History,
             pol: RestartPolicy) -> Decision:
    """`why_not`: why the conditional policy would not restart (None: a restart helps)."""
    h = _after_attempt(hist, made_progress)
    if pol.max_restarts == 0:
        return _give_up("auto restart is off (--max-restarts 0)", h,
                        result=RecoverResult.TERMINATED)
    if h.attempts_without_progress >= pol.no_progress_limit:
        return _give_up(f"{h.attempts_without_progress} runs in a row (attempts or "
                        "in-process restarts) made no progress "
                        f"(limit {pol.no_progress_limit})", h, code=ExitCode.NO_PROGRESS,
                        limit=Reason.NO_PROGRESS)
    if why_not is not None and not pol.unconditional:
        return _give_up(f"not restarted: {why_not} (use --unconditional-restart to restart "
                        "anyway)", h)
    if h.restarts_used >= pol.max_restarts:
        return _give_up(f"restart budget spent ({plural(pol.max_restarts, 'restart')})", h,
                        result=RecoverResult.QUOTA_EXCEEDED, limit=Reason.RESTART_LIMIT_REACHED)
    if why_not is not None:
        if h.consecutive_unconditional >= pol.unconditional_max_consecutive:
            return _give_up(f"{h.consecutive_unconditional} unconditional restarts in a row "
                            f"(limit {pol.unconditional_max_consecutive})", h,
                            result=RecoverResult.QUOTA_EXCEEDED,
                            limit=Reason.RESTART_LIMIT_REACHED)
        h = replace(h, consecutive_unconditional=h.consecutive_unconditional + 1)
        start_type = StartType.UNCONDITIONAL_RESTART
    else:
        start_type = StartType.AUTO_RESTART
    delay = backoff(h.consecutive_failures, pol)
    h = replace(h, restarts_used=h.restarts_used + 1)
    return Decision(Action.RESTART, f"restart {h.restarts_used}/{pol.max_restarts} after {what}",
                    h, rung=Rung.PROCESS_RESTART, start_type=start_type, delay_s=delay)


def after_hang(made_progress: bool, hist: History, pol: HAPolicy) -> Decision:
    """Restart upon suspension: in place, at once, outside the restart budget."""
    h = replace(hist, hang_restarts=0) if made_progress else hist
    n = pol.max_hang_restarts
    if h.hang_restarts >= n:
        # as the no-progress guard: a job that hangs every time is not to be requeued as is
        return _give_up(f"{n} restarts upon suspension in a row made no progress; giving up",
                        h, result=RecoverResult.QUOTA_EXCEEDED, code=ExitCode.NO_PROGRESS,
                        limit=Reason.HANG_RESTART_LIMIT_REACHED)
    h = replace(h, hang_restarts=h.hang_restarts + 1)
    return Decision(Action.RESTART,
                    f"restart upon suspension {h.hang_restarts}/{n} in a row (the restart "
                    "budget is not used); restarting in place", h, rung=Rung.PROCESS_RESTART,
                    start_type=StartType.SUSPENSION_RESTART)


def _give_up(reason: str, h: History, *, result: RecoverResult = RecoverResult.FAILED,
             code: ExitCode = ExitCode.FAILED, limit: Reason | None = None) -> Decision:
    return Decision(Action.GIVE_UP, reason, h, result=result,
                    exit_code=code, limit=limit)


def _after_attempt(h: History, made_progress: bool) -> History:
    if made_progress:
        return replace(h, consecutive_failures=1, consecutive_unconditional=0,
                       attempts_without_progress=0)
    return replace(h, consecutive_failures=h.consecutive_failures + 1,
                   attempts_without_progress=h.attempts_without_progress + 1)


def backoff(consecutive_failures: int, pol: RestartPolicy) -> float:
    """Exponential: backoff_s, 2x, 4x ... capped at backoff_max_s; first failure waits backoff_s."""
    n = max(consecutive_failures, 1) - 1
    return float(min(pol.backoff_s * (2 ** min(n, 32)), pol.backoff_max_s))
