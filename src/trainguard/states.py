"""The three lifecycles: a job's, a node's and a worker's, each with its transitions. Pure.

Each lifecycle is an enum whose values are what the job store (SQLite) and the JSON documents
(`trainguard status --json`, the wire) hold: never change a value. Its transitions are written
here once, as a mapping state -> the states that may follow it, and the groups the code asks
about (`JobState.active`, `NodeState.usable`, `WorkerState.ended`...) are properties of the
states, so a rule reads as `node.state.usable`, not as a tuple of strings. Stdlib only.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from enum import Enum
from typing import Any


class JobState(str, Enum):
    """Lifecycle of one launch of a job (the `state` key of the store's meta):

        PENDING ──► RUNNING | QUEUING
        RUNNING ◄─► RESTARTING ◄─► QUEUING ◄─► RUNNING
        RUNNING ──► SUCCEEDED
        each of those four (active) ──► FAILED | STOPPED | LOST   (ended: nothing follows)

    PENDING: recorded, no attempt started yet. RUNNING: an attempt's workers run.
    RESTARTING: an attempt ended, the next one is scheduled (backoff). QUEUING: waiting for
    enough healthy nodes (multi-node: a lost or isolated node, a failed pre-check).
    SUCCEEDED, FAILED, STOPPED: recorded by the launcher as the job ended.
    LOST is never stored: `trainguard status` shows it when the store says the job is
    active but its launcher's process is dead (`controller.store.shown_state`).

    A launcher started again on the same job dir begins a new lifecycle: at PENDING
    (Recorder.begin, any previous state), or at RUNNING when it takes over the attempt a
    dead controller left running (Recorder.adopt, from a `resumable` state).
    """

    PENDING = "pending"
    RUNNING = "running"
    RESTARTING = "restarting"
    QUEUING = "queuing"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    LOST = "lost"

    @property
    def next_states(self) -> frozenset[JobState]:
        return JOB_TRANSITIONS[self]

    @property
    def ended(self) -> bool:
        """Nothing follows it in this launch: the job ended, or its launcher is gone."""
        return not JOB_TRANSITIONS[self]

    @property
    def active(self) -> bool:
        """A launcher should be alive (the store says so; LOST when its pid is dead)."""
        return bool(JOB_TRANSITIONS[self])

    @property
    def resumable(self) -> bool:
        """A controller that died in this state is taken over by the next launcher of the
        job (multi-node, launch.py): same token and port, so its agents reconnect; it
        watches the attempt on when every placed node still runs it, else it ends the old
        agents and launches again. QUEUING and PENDING do not count: no attempt runs, and a
        takeover would keep the lost and isolated nodes out, so a relaunch on the same
        allocation could not find enough nodes; a fresh launch starts every node again."""
        return self in (JobState.RUNNING, JobState.RESTARTING)


JOB_TRANSITIONS: Mapping[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset({JobState.RUNNING, JobState.QUEUING, JobState.FAILED,
                                 JobState.STOPPED, JobState.LOST}),
    JobState.RUNNING: frozenset({JobState.RESTARTING, JobState.QUEUING, JobState.SUCCEEDED,
                                 JobState.FAILED, JobState.STOPPED, JobState.LOST}),
    JobState.RESTARTING: frozenset({JobState.RUNNING, JobState.QUEUING, JobState.FAILED,
                                    JobState.STOPPED, JobState.LOST}),
    JobState.QUEUING: frozenset({JobState.RUNNING, JobState.RESTARTING, JobState.FAILED,
                                 JobState.STOPPED, JobState.LOST}),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.STOPPED: frozenset(),
    JobState.LOST: frozenset(),
}
# the states' values the read commands call ended (`lost` too: nothing runs any more)
JOB_ENDED = frozenset(s.value for s in JobState if s.ended)


# said in a why_ended() when the cluster ended the agent's step on purpose (a requeue, a time
# limit, a preemption, scancel): the node is lost to the job, but not at fault (not drained)
NOT_THE_NODE = "the cluster ended it, not a fault of the node"
# ... nor is one whose agent got SIGTERM: it stopped its workers and leaves (node/term.py)
AGENT_TERMINATED = "its agent got SIGTERM from outside the launcher"


class NodeState(str, Enum):
    """Lifecycle of one node of a multi-node job (controller.fleet; the store's `nodes`):

        SPARE ◄──► HEALTHY          (placed: HEALTHY; in the job, not placed: SPARE)
          │           │
          └─────┬─────┘
                ▼
          LOST | ISOLATED           (out of this job for good: never placed again)

    LOST: its agent's process ended, it stayed disconnected past the reconnect grace or
    silent past the node timeout, or it did not connect. ISOLATED: kept out (implicated in
    faults, a failed pre-check), and drained where the backend can.
    """

    HEALTHY = "healthy"
    SPARE = "spare"
    LOST = "lost"
    ISOLATED = "isolated"

    @property
    def next_states(self) -> frozenset[NodeState]:
        return NODE_TRANSITIONS[self]

    @property
    def usable(self) -> bool:
        """In the job: placed or spare (commands go to it; it may be placed)."""
        return bool(NODE_TRANSITIONS[self])

    @property
    def out(self) -> bool:
        """Lost or isolated: out of this job for good."""
        return not NODE_TRANSITIONS[self]


NODE_TRANSITIONS: Mapping[NodeState, frozenset[NodeState]] = {
    NodeState.SPARE: frozenset({NodeState.HEALTHY, NodeState.LOST, NodeState.ISOLATED}),
    NodeState.HEALTHY: frozenset({NodeState.SPARE, NodeState.LOST, NodeState.ISOLATED}),
    NodeState.LOST: frozenset(),
    NodeState.ISOLATED: frozenset(),
}


class WorkerState(str, Enum):
    """Lifecycle of one worker process (node.agent; the store's `workers`):

        STARTING ──► RUNNING ──► SUCCEEDED | FAILED | STOPPED
            └──────────────────► SUCCEEDED | FAILED | STOPPED   (ended before seen running)

    A worker of a node the controller declares lost is reported FAILED (controller.fleet).
    """

    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"  # exited 0
    FAILED = "failed"  # exited non-zero or died of a signal on its own
    STOPPED = "stopped"  # ended because the agent stopped it

    @property
    def next_states(self) -> frozenset[WorkerState]:
        return WORKER_TRANSITIONS[self]

    @property
    def ended(self) -> bool:
        return not WORKER_TRANSITIONS[self]


class StopCause(str, Enum):
    """Who stopped a STOPPED rank (node.agent; the store's `workers.stopped_by`): this
    launcher (its stop, a drain it told), or the node agent on a SIGTERM of its own, from
    outside the launcher (a person's kill, the cluster ending the node's step, a shutdown:
    node/term.py). The verdict tells them apart by this, not by times (review 53 #1-#4)."""

    LAUNCHER = "launcher"
    OUTSIDE = "outside"


def ended_state(returncode: int, draining: StopCause | None) -> WorkerState:
    """How a rank ended, from its exit status and who was stopping its node's ranks when
    the agent saw it: SIGTERM's exit while a stop was under way is STOPPED, and so is an
    exit 0 on the node's SIGTERM from outside (a handler that exits 0: review 55 #6, it read
    succeeded in a job stopped from outside); else exit 0 SUCCEEDED, the rest FAILED."""
    on_term = returncode in (143, -signal.SIGTERM) or (
        returncode == 0 and draining == StopCause.OUTSIDE)
    if draining is not None and on_term:
        return WorkerState.STOPPED
    return WorkerState.SUCCEEDED if returncode == 0 else WorkerState.FAILED


_WORKER_ENDINGS = frozenset({WorkerState.SUCCEEDED, WorkerState.FAILED, WorkerState.STOPPED})
WORKER_TRANSITIONS: Mapping[WorkerState, frozenset[WorkerState]] = {
    WorkerState.STARTING: _WORKER_ENDINGS | {WorkerState.RUNNING},
    WorkerState.RUNNING: _WORKER_ENDINGS,
    WorkerState.SUCCEEDED: frozenset(),
    WorkerState.FAILED: frozenset(),
    WorkerState.STOPPED: frozenset(),
}

# every lifecycle with its transitions (state -> the states that may follow it)
TRANSITIONS: Mapping[type[Enum], Mapping[Any, frozenset[Any]]] = {
    JobState: JOB_TRANSITIONS,
    NodeState: NODE_TRANSITIONS,
    WorkerState: WORKER_TRANSITIONS,
}


def exit_seen(exit_code: int | None, signal: str | None) -> bool:
    """Whether a rank's end was seen: an exit code or a signal recorded (a rank its node's
    agent went away with has neither; shown_rank_state)."""
    return exit_code is not None or signal is not None


def shown_rank_state(state: str, job_state: str | None, agent_runs: bool,
                     end_seen: bool = True) -> str:
    """A rank's state as `status` and the dashboard show it: one not ended when its
    launcher died reads `lost` (the guardian killed it with the launcher: nothing recorded
    its end), unless its node's agent still runs (it keeps its workers for a takeover); so
    does one recorded failed with no exit seen (`end_seen` False, exit_seen: its node's agent went
    away with it, a lost node or a cluster that ended the agents' steps; walk-through 42
    #12: such ranks read `failed`, exit code `-`)."""
    if job_state == JobState.LOST.value and not WorkerState(state).ended and not agent_runs:
        return "lost"
    if state == WorkerState.FAILED.value and not end_seen:
        return "lost"
    return state


# why a node of a job whose launcher died reads `lost` (shown_node)
AGENT_GONE = "its agent no longer runs: the launcher is gone, and nothing watched the node since"


def shown_node(state: str, reason: str | None, job_state: str | None,
               agent_runs: bool) -> tuple[str, str | None]:
    """A node's (state, reason) as `status` and the dashboard show them: a healthy or spare
    node of a job whose launcher died reads `lost` unless its agent still runs, as its ranks
    do (walk-through 42: under Slurm, a node that went down after the launcher died read
    `healthy`: its last recorded state)."""
    if (job_state == JobState.LOST.value and not agent_runs
            and state in (NodeState.HEALTHY.value, NodeState.SPARE.value)):
        return NodeState.LOST.value, AGENT_GONE
    return state, reason
