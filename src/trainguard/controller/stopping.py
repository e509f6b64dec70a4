"""Stopping an attempt's workers: what is left of it after a failure or a confirmed hang (a
`WorkersStopped` event says who and how), or all of it at its end. The node agents send
SIGTERM, wait the grace period, then SIGKILL; the recorder keeps syncing meanwhile (ranks
may train on, and a save on the way out may commit)."""

from __future__ import annotations

import signal

from trainguard.controller.faults import stopped_by
from trainguard.controller.recorder import Recorder
from trainguard.exitcodes import ExitCode
from trainguard.protocol import AgentAPI, NodeReport, StopWorkers
from trainguard.records import Level, Reason, rank_list
from trainguard.states import JobState, StopCause, WorkerState

# the grace a confirmed hang's ranks get to exit after SIGTERM (the spec's when shorter): most
# reach no step end where a save on the way out could run (walk-through 33 #4: the llm
# preset's 15 s were waited in full at every restart upon suspension); one that does (a rank
# frozen mid-step, continued by the stop) gets the job's grace period while it saves
HUNG_GRACE_S = 3.0


def stop(agent: AgentAPI, rec: Recorder, reason: str, dead: list[int] | None = None,
         grace: float | None = None) -> NodeReport:
    """Stop what is left of the attempt (workers, their children) and read all logs. A
    `grace` shorter than the job's grace period lasts up to the job's while a rank saves on
    its way out (a hung rank continued by the stop can finish its step and save it; review
    of walk-through 33 #9)."""
    full = rec.spec.grace_period_s
    cmd = StopWorkers(grace_s=full if grace is None else grace, reason=reason,
                      dead_ranks=dead or [],
                      saving_grace_s=full if grace is not None and grace < full else None)
    report = agent.stop_workers(cmd, meanwhile=rec.sync)
    rec.sync(report, force=True)
    return report


def stop_rest(agent: AgentAPI, rec: Recorder, attempt: int, reason: str,
              dead: list[int] | None = None) -> NodeReport:
    """The workers left after `dead` ranks failed, or (none dead) after a confirmed hang."""
    grace = rec.spec.grace_period_s if dead else min(rec.spec.grace_period_s, HUNG_GRACE_S)
    report = stop(agent, rec, reason, dead, grace)
    what = "other" if dead else "hung"
    mine = [w for w in report.workers if w.state == WorkerState.STOPPED  # (not the ones a
            and w.stopped_by != StopCause.OUTSIDE]  # node agent's SIGTERM stopped: review 53)
    ranks = [w.rank for w in mine]
    killed = [w.rank for w in mine if w.returncode == -signal.SIGKILL]
    late = f"; rank(s) {rank_list(killed)} did not exit within it and got SIGKILL" \
        if killed else ""
    done = (f"stopped {len(ranks)} {what} worker(s): rank(s) {rank_list(ranks)} "
            f"(grace {grace:g}s{late})" if ranks else "no other workers to "
            "stop (the job has 1 rank)" if len(report.workers) == 1 else
            f"no {what} workers left to stop (every rank had exited)")
    rec.event(Level.INFO, Reason.WORKERS_STOPPED, done, attempt=attempt)
    return report


def ended_well(agent: AgentAPI, rec: Recorder, attempt: int, report: NodeReport) -> int:
    """Every rank ended and none failed: the job succeeded when each exited 0; ranks that
    ended `stopped` on a SIGTERM this launcher did not send (their node agents got it too:
    the cluster ending their steps, Slurm's scancel, time limit or preemption of an
    allocation the launcher is outside of, or a person's) stopped the job, exit 143, never a
    success (review 52 #1: `JobSucceeded`, exit 0, at step 27 of 3000)."""
    outside = sorted(w.rank for w in report.workers if w.state == WorkerState.STOPPED
                     and w.stopped_by != StopCause.LAUNCHER)
    nodes = report.terminating_nodes  # (as decided on: a node lost in the stop leaves the
    # merged report after it; review 55 #6)
    report = stop(agent, rec, "every worker exited 0" if not outside  # reaps leftovers,
                  else "ranks stopped from outside")  # reads the last lines
    if not outside:
        rec.book.attempt_succeeded(attempt, report.progress)
        return rec.end_job(JobState.SUCCEEDED, ExitCode.SUCCESS,
                           f"all {len(report.workers)} worker(s) exited 0 after "
                           f"{attempt + 1} attempt(s)", attempt=attempt)
    ranks = f"rank(s) {rank_list(outside)}"  # (a rank stopped so: its agent got it first,
    what = (f"{agents_signalled(nodes)} ({ranks} ended on it)"  # and says
            if nodes else f"{ranks} ended on a SIGTERM this launcher did "
            "not send (their node agents got it too)")  # so in its reports)
    return stopped_outside(rec, attempt, report, what)


def agents_signalled(nodes: list[str]) -> str:
    """Who stopped a job from outside: the same words whether the ranks' exits or their
    agents' flags (controller/ending_nodes.py) were seen first."""
    return f"the node agents of {', '.join(nodes)} got a SIGTERM this launcher did not send"


def stopped_outside(rec: Recorder, attempt: int, report: NodeReport, what: str) -> int:
    rec.book.attempt_stopped(attempt, stopped_by("SIGTERM"), report.progress)
    return rec.end_stopped(signal.SIGTERM, f"stopped from outside: {what}", attempt)
