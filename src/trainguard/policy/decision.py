"""The shapes of the recovery ladder: what happened (Incident), what is remembered
(History), the knobs (HAPolicy) and the one answer (Decision). Pure data."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from trainguard.diagnosis.taxonomy import Diagnosis
from trainguard.exitcodes import ExitCode
from trainguard.policy.precheck import PrecheckReport
from trainguard.records import Reason, RecoverResult, StartType
from trainguard.spec import JobSpec, RestartPolicy


class IncidentKind(str, Enum):
    CRASH = "crash"  # a worker failed; the attempt's diagnosis says why
    HANG = "hang"  # a hang was confirmed (restart upon suspension is on)
    NODE_LOST = "node_lost"  # a placed node's agent is gone, silent, or its step ended
    PRECHECK_FAILED = "precheck_failed"  # nodes failed the pre-check before an attempt
    STEP_FAILED = "step_failure"  # a rank's StepGuard reported a failed step; the ranks wait
    GROUP_FAILED = "group_failed"  # every rank's process group broke; every process lives


class Rung(str, Enum):
    """The ladder's rungs, finest first."""

    STEP_REEXECUTION = "step_reexecution"  # rung 0: re-form the group, re-run the step
    IN_PROCESS_RESTART = "in_process_restart"  # rung 1a: replace one rank, the rest re-enter
    PROCESS_RESTART = "process_restart"  # rung 1b: restart the processes in place
    POD_RESCHEDULE = "pod_reschedule"  # rung 2: replace one node with a spare
    JOB_RESCHEDULE = "job_reschedule_with_taint"  # rung 3: isolate, place every rank again


class Action(str, Enum):
    RESTART = "restart"  # start the next attempt in place (start_type), after delay_s
    RESCHEDULE = "reschedule"  # place the ranks again (placement), then start the next attempt
    REPLACE = "replace"  # before an attempt: give the isolated nodes' slots to spares
    GIVE_UP = "give_up"  # end the job with exit_code
    REEXECUTE = "reexecute"  # rung 0: every rank re-forms the group and re-runs the step
    DOWNGRADE = "downgrade"  # rung 0 cannot act: the ranks raise, their exit is the next rung's
    RESTART_RANKS = "restart_ranks"  # in-process: start `ranks` again, the rest re-enter in place


@dataclass(frozen=True)
class HAPolicy:
    """Every budget of the ladder (built from JobSpec.ha_policy)."""

    restart: RestartPolicy = field(default_factory=RestartPolicy)
    operator_reexecution: bool = False  # rung 0 on (--operator-reexecution)
    step_retries: int = 1  # re-executions of one step (the platform's MaxCnt)
    max_step_retries: int = 10  # re-executions in the whole job
    max_hang_restarts: int = 3  # restarts upon suspension in a row without progress
    max_pod_reschedules: int = 3
    max_job_reschedules: int = 3
    repeat_offender_count: int = 3  # implicated this many times in the window: isolated
    repeat_window_s: float = 3600.0

    @staticmethod
    def from_spec(spec: JobSpec) -> HAPolicy:
        return HAPolicy(restart=spec.restart_policy,
                        operator_reexecution=spec.operator_reexecution,
                        step_retries=spec.step_retries, max_step_retries=spec.max_step_retries,
                        max_pod_reschedules=spec.max_pod_reschedules,
                        max_job_reschedules=spec.max_job_reschedules,
                        repeat_offender_count=spec.repeat_offender)


@dataclass(frozen=True)
class History:
    """What the ladder remembers between attempts. The budgets' counters (restarts_used,
    hang_restarts, step_retries, pod_used, job_used, implicated) are kept in the job store
    (a relaunch starts restarts_used again, Recorder.begin); the consecutive counters and
    the per-step count start afresh with each launcher."""

    restarts_used: int = 0
    consecutive_failures: int = 0  # failed attempts since the last one that made progress
    consecutive_unconditional: int = 0
    attempts_without_progress: int = 0
    hang_restarts: int = 0  # restarts upon suspension in a row without progress
    step_retries: int = 0  # step re-executions in the job
    retried_step: int | None = None  # the last step re-executed, and how often
    retried_step_count: int = 0
    in_process_in_a_row: int = 0  # in-process restarts since the last progress
    pod_used: int = 0
    job_used: int = 0
    implicated: tuple[tuple[str, float], ...] = ()  # (node, unix time) per implication

    def to_meta(self) -> dict[str, Any]:
        """The persisted counters, as job-store meta keys."""
        return {"restarts_used": self.restarts_used, "hang_restarts": self.hang_restarts,
                "step_retries_used": self.step_retries,
                "pod_reschedules_used": self.pod_used, "job_reschedules_used": self.job_used,
                "implicated": json.dumps(self.implicated)}

    @staticmethod
    def from_meta(meta: Mapping[str, Any]) -> History:
        """The persisted counters back (missing or damaged keys count as 0 / none)."""
        def count(key: str) -> int:
            try:
                return max(int(meta.get(key) or 0), 0)
            except (TypeError, ValueError):
                return 0

        implicated: tuple[tuple[str, float], ...] = ()
        with contextlib.suppress(TypeError, ValueError):  # [[node, unix time], ...]
            implicated = tuple((str(n), float(t))
                               for n, t in json.loads(meta.get("implicated") or "[]"))
        return History(restarts_used=count("restarts_used"), hang_restarts=count("hang_restarts"),
                       step_retries=count("step_retries_used"),
                       pod_used=count("pod_reschedules_used"),
                       job_used=count("job_reschedules_used"), implicated=implicated)


@dataclass(frozen=True)
class InProcessCase:
    """In-process restart applies (it is on, every surviving rank runs run_resilient, one
    node): `ranks` would start again (the dead, the hung culprit; empty: no single one),
    `survivors` would re-enter their training function."""

    ranks: tuple[int, ...]
    survivors: tuple[int, ...]


@dataclass(frozen=True)
class Incident:
    """What ended (or would start) an attempt, with the facts the ladder needs."""

    kind: IncidentKind
    made_progress: bool = False  # the attempt got further than every earlier one
    diagnosis: Diagnosis | None = None  # CRASH
    node: str | None = None  # NODE_LOST: the lost node; CRASH: the culprit's placed node
    why: str = ""  # NODE_LOST: how it was lost; STEP_FAILED: the error
    step: int | None = None  # STEP_FAILED: the step that failed
    ended_ranks: tuple[int, ...] = ()  # STEP_FAILED: ranks whose process already ended
    # STEP_FAILED: running ranks that did not report the failure within reports_within_s
    silent_ranks: tuple[int, ...] = ()
    stale_group: bool = False  # STEP_FAILED: reported on a group older than the newest formed
    failing: tuple[PrecheckReport, ...] = ()  # PRECHECK_FAILED: the failed nodes' reports
    checked: int = 0  # PRECHECK_FAILED: how many nodes were checked
    placement: tuple[str, ...] = ()  # slot -> node, now
    spares: tuple[str, ...] = ()  # ready spare nodes, now
    now_s: float = 0.0  # unix time (the repeat-offender window)
    in_process: InProcessCase | None = None  # CRASH / HANG: None when the rung does not apply


@dataclass(frozen=True)
class Tried:
    """A rung that could not act: why, and what its recover record says."""

    rung: Rung
    result: RecoverResult  # DOWNGRADE (cannot act) or QUOTA_EXCEEDED (budget spent)
    why: str


@dataclass(frozen=True)
class Isolation:
    """Keep `node` out of the job; `drain`: out of the cluster too (Slurm: DRAIN)."""

    node: str
    why: str
    drain: bool = True


@dataclass(frozen=True)
class Decision:
    """The ladder's one answer. `tried` lists the rungs that could not act (their records
    say downgrade / quotaExceeded); `rung` is the one that acts (None: none could)."""

    action: Action
    reason: str
    history: History
    rung: Rung | None = None
    start_type: StartType | None = None  # RESTART / RESCHEDULE: the next attempt's
    delay_s: float = 0.0
    result: RecoverResult = RecoverResult.RECOVERING  # the incident's recover record
    tried: tuple[Tried, ...] = ()
    isolate: tuple[Isolation, ...] = ()  # carried out before anything else
    node: str | None = None  # the node the decision is about
    ranks: tuple[int, ...] = ()  # RESTART_RANKS: the ranks started again
    placement: tuple[str, ...] = ()  # RESCHEDULE: the new slot -> node list
    moved_slots: tuple[int, ...] = ()  # RESCHEDULE: slots whose ranks land on another node
    missing: int = 0  # RESCHEDULE/REPLACE: nodes to wait for (queuing) before starting
    exit_code: ExitCode | None = None  # GIVE_UP
    limit: Reason | None = None  # GIVE_UP on a spent budget: the event that says which
