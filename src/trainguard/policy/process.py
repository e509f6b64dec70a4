"""Restart or give up? Pure: (Diagnosis, history, RestartPolicy) -> Decision.

Rules (docs/restart-policy.md):
- auto restart is off when max_restarts == 0 (torchrun's default);
- conditional (default): restart only when the diagnosis says a restart can help;
- unconditional: also restart what conditional would not, at most N consecutive;
- every restart spends one of max_restarts;
- an attempt that made progress resets the consecutive counters and the backoff;
- after `no_progress_limit` attempts in a row without progress: give up, do not requeue.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

from trainguard.diagnosis.taxonomy import Diagnosis, RestartHelps
from trainguard.records import RecoverResult, StartType
from trainguard.spec import RestartPolicy


class Action(str, Enum):
    RESTART = "restart"
    FAIL = "fail"
    GIVE_UP_NO_PROGRESS = "give_up_no_progress"


@dataclass(frozen=True)
class History:
    """What the policy remembers between attempts."""

    restarts_used: int = 0
    consecutive_failures: int = 0  # failed attempts since the last one that made progress
    consecutive_unconditional: int = 0
    attempts_without_progress: int = 0


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    delay_s: float = 0.0
    start_type: StartType | None = None
    result: RecoverResult = RecoverResult.FAILED
    history: History = History()


def decide(diag: Diagnosis, made_progress: bool, hist: History, pol: RestartPolicy) -> Decision:
    """Decide what follows a failed attempt."""
    h = _after_attempt(hist, made_progress)
    if pol.max_restarts == 0:
        return Decision(Action.FAIL, "auto restart is off (--max-restarts 0)",
                        result=RecoverResult.TERMINATED, history=h)
    if h.attempts_without_progress >= pol.no_progress_limit:
        return Decision(Action.GIVE_UP_NO_PROGRESS,
                        f"{h.attempts_without_progress} attempts in a row made no progress "
                        f"(limit {pol.no_progress_limit})", history=h)
    conditional_ok = diag.restart_helps != RestartHelps.NO
    if not conditional_ok and not pol.unconditional:
        return Decision(Action.FAIL,
                        f"not restarted: {diag.category.value} in the "
                        f"{diag.fault_domain.value} domain will fail again (use "
                        "--unconditional-restart to restart anyway)",
                        history=h)
    if h.restarts_used >= pol.max_restarts:
        return Decision(Action.FAIL, f"restart budget spent ({pol.max_restarts} restarts)",
                        result=RecoverResult.QUOTA_EXCEEDED, history=h)
    if not conditional_ok:
        if h.consecutive_unconditional >= pol.unconditional_max_consecutive:
            return Decision(Action.FAIL,
                            f"{h.consecutive_unconditional} unconditional restarts in a row "
                            f"(limit {pol.unconditional_max_consecutive})",
                            result=RecoverResult.QUOTA_EXCEEDED, history=h)
        h = replace(h, consecutive_unconditional=h.consecutive_unconditional + 1)
        start_type = StartType.UNCONDITIONAL_RESTART
    else:
        start_type = StartType.AUTO_RESTART
    delay = backoff(h.consecutive_failures, pol)
    h = replace(h, restarts_used=h.restarts_used + 1)
    return Decision(Action.RESTART,
                    f"restart {h.restarts_used}/{pol.max_restarts} after {diag.category.value}",
                    delay_s=delay, start_type=start_type, result=RecoverResult.RECOVERING,
                    history=h)


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
