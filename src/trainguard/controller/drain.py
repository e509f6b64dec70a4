"""The saves a job's end waits for. Drain on a stop request: before the launcher stops the
workers (`trainguard stop`, SIGTERM or SIGINT to it), the ranks that drain (the trainer
integrations, trainguard.integrations.drain) are asked to save a checkpoint at the next step
end and exit; the launcher waits for them up to the grace period, then stops what is left as
always (SIGTERM, the grace period, SIGKILL).

Only a stop asked for drains: a failure or a hang stops the workers at once, as before. A job
with no rank listening for a drain (a plain script) is stopped without waiting.

A job that gives up first lets a save at breakpoint under way (the node agents persisting the
memory snapshots) finish, so that its CheckpointSaved or CheckpointSaveFailed is recorded
before JobFailed (finish_saves; walk-through 27: its failure was only a console line).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from trainguard.controller.recorder import Recorder
from trainguard.errors import LaunchError
from trainguard.protocol import PERSIST_WAIT_S, AgentAPI, Tell
from trainguard.records import Level, Reason
from trainguard.worker.contract import ControlKind

log = logging.getLogger(__name__)

POLL_S = 0.25


def drain(agent: AgentAPI, rec: Recorder, attempt: int, grace_s: float, why: str,
          cut_short: Callable[[], bool] = lambda: False) -> bool:
    """Ask every running rank to drain; wait until they all ended, or `grace_s`, or
    `cut_short()` (a second Ctrl-C). True when every rank drained: a checkpoint was
    committed meanwhile and every rank ended by itself (whatever its exit: torch may abort
    a drained rank at interpreter exit)."""
    try:
        told = agent.tell(Tell(control={"kind": ControlKind.DRAIN.value, "reason": why}))
    except LaunchError as e:  # a node's agent could not be reached: stop as always
        log.warning("could not ask the ranks to drain: %s", e)
        return False
    if told == 0:
        return False
    rec.event(Level.INFO, Reason.DRAIN_REQUESTED,
              f"{why}: asked {told} rank(s) to save a checkpoint at the next step end and exit "
              f"(waiting up to the grace period, {grace_s:g}s)", attempt=attempt)
    before = rec.messages.committed_this_attempt
    deadline = time.monotonic() + grace_s
    while (left := deadline - time.monotonic()) > 0 and not cut_short():
        report = agent.poll(wait_s=min(left, POLL_S))
        rec.sync(report)
        if report.workers and all(w.state.ended for w in report.workers):
            after = rec.messages.committed_this_attempt
            return after is not None and (before is None or after > before)
    log.info("the ranks did not drain within %gs; stopping them", grace_s)
    return False


def finish_saves(agent: AgentAPI, rec: Recorder, stopping: Callable[[], bool]) -> None:
    """Wait, polling, while a node agent persists the memory snapshots (up to
    PERSIST_WAIT_S, or `stopping()`: a signal), recording what the reports bring."""
    deadline = time.monotonic() + PERSIST_WAIT_S
    while True:
        try:
            report = agent.poll(wait_s=POLL_S)
        except LaunchError as e:  # a node's agent could not be reached: end as always
            log.warning("could not wait for the save at breakpoint: %s", e)
            return
        rec.sync(report)
        if not report.persisting or stopping() or time.monotonic() > deadline:
            return
