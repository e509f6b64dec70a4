"""A job's ledger input, read from its store (running records, progress, events)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from trainguard.controller.shown import last_sign_of_life, shown_state
from trainguard.controller.store import JobStore
from trainguard.goodput.ledger import Attempt, Goodput, Incident, LedgerInput, account
from trainguard.policy.decision import Rung
from trainguard.records import (
    BY_CLUSTER,
    NO_RECOVERY,
    FaultScenario,
    Reason,
    RecoverRecord,
    RecoverResult,
    RunningRecord,
    StartType,
    from_iso,
    utcnow,
)
from trainguard.states import JOB_ENDED, JobState
from trainguard.worker.contract import SOURCE_MEMORY

_LAUNCHES = (StartType.FIRST_START, StartType.RELAUNCH)
_RESTARTED = (RecoverResult.SUCCESS, RecoverResult.RECOVERING)
_IN_ATTEMPT = (Rung.STEP_REEXECUTION.value, Rung.IN_PROCESS_RESTART.value)


@dataclass(frozen=True)
class Save:
    """One committed checkpoint, as its CheckpointSaved event says."""

    at: float  # epoch seconds
    attempt: int | None
    step: int | None
    blocked_s: float | None  # the training loop's wait (None: not reported)
    resumed_before_s: float  # the loop went on this long before the commit (an async write)
    on_exit: bool  # saved on the way out (not the loop's cadence)
    by_agent: bool  # persisted by the node agent from memory snapshots
    sent_at: float | None = None  # when its sender said it was committed, by its own clock


def saves(store: JobStore) -> list[Save]:
    """Every checkpoint commit, read field by field (a long job has tens of thousands)."""
    rows = store.event_values(Reason.CHECKPOINT_SAVED.value,
                              ("step", "blocked_s", "resumed_before_s", "on_exit", "source",
                               "sent_at"))
    return [Save(t, a, step if isinstance(step, int) else None,
                 float(b) if isinstance(b, int | float) else None,
                 float(r) if isinstance(r, int | float) else 0.0,  # (not said before 2026-12-04)
                 bool(on_exit), source == SOURCE_MEMORY,
                 float(sent) if isinstance(sent, int | float) else None)  # (since 2026-12-05)
            for t, a, (step, b, r, on_exit, source, sent) in rows]


@dataclass(frozen=True)
class SnapshotReport:
    """Rank 0's memory snapshots since its report before (SNAPSHOT_BLOCKING), as stored."""

    attempt: int
    at: float  # epoch seconds: when the last of them returned
    blocked_s: float  # the training loop's wait for them, summed
    snapshots: int


def snapshot_reports(store: JobStore) -> list[SnapshotReport]:
    """Rank 0's (the job's figure, as its saves' are); [] for a store before schema 6."""
    return [SnapshotReport(*row) for row in store.snapshot_blocking(rank=0)]


def job_goodput(store: JobStore, now: datetime | None = None,
                commits: list[Save] | None = None, meta: dict[str, object] | None = None,
                records: list[RunningRecord] | None = None) -> Goodput:
    """The goodput of the job in `store`, as of `now` while it runs (`commits`, `meta`,
    `records`: what the caller has read from the store already)."""
    hangs = [(a, t) for t, a, _ in store.event_values(Reason.HANG_CONFIRMED.value, ())
             if a is not None]
    queues = [(a, t) for t, a, _ in store.event_values(Reason.QUEUING.value, ())
              if a is not None]
    relaunches = [t for t, _, _ in store.event_values(Reason.JOB_RELAUNCHED.value, ())]
    told = bool(store.event_values(Reason.NO_PROGRESS_SIGNAL.value, ()))
    resumed: dict[int, int] = {}
    for _, a, (step,) in store.event_values(Reason.RESUMED.value, ("step",)):
        if a is not None and isinstance(step, int):
            resumed[a] = max(step, resumed.get(a, step))
    last_event = store.last_event_time()
    stops = user_stops([t for t, _, _ in store.event_values(Reason.STOP_REQUESTED.value, ())],
                       [(t, bool(by)) for t, _, (by,) in store.event_values(
                           Reason.JOB_STOPPED.value, (BY_CLUSTER,))])
    return account(ledger_input(store.meta() if meta is None else meta,
                                store.running_records() if records is None else records,
                                store.progress(),
                                saves(store) if commits is None else commits, hangs,
                                last_event, now or utcnow(), queues, relaunches,
                                snapshot_reports(store), told, resumed, stops))


def user_stops(requested: list[float], stopped: list[tuple[float, bool]]) -> list[float]:
    """When each stop a person made began: its request (StopRequested), else its end
    (JobStopped); a stop the cluster made (a requeue: `by_cluster`) is none (its wait for the
    next launch is `queued`). Both lists oldest first."""
    out, after = [], float("-inf")
    for at, by_cluster in stopped:
        asked = [t for t in requested if after < t <= at]
        if not by_cluster:
            out.append(asked[-1] if asked else at)
        after = at
    return out


def ledger_input(meta: dict[str, object], records: list[RunningRecord],
                 samples: list[tuple[int, int, float]], commits: list[Save],
                 hangs: list[tuple[int, float]], last_event: float | None,
                 now: datetime, queues: list[tuple[int, float]] | None = None,
                 relaunches: list[float] | None = None,
                 snapshots: list[SnapshotReport] | None = None,
                 told_no_steps: bool = False,
                 resumed: dict[int, int] | None = None,
                 stops: list[float] | None = None) -> LedgerInput:
    """`relaunches`: when each relaunch of the job dir began (its JobRelaunched event);
    `snapshots`: the memory snapshots' blocking, booked as checkpoint_blocking;
    `told_no_steps`: its ranks were found printing without step reports (NoProgressSignal);
    `resumed`: attempt -> the step it resumed from (its Resumed events); `stops`: when each
    stop a person made began (user_stops)."""
    attempts = [Attempt(r.attempt, r.start_at.timestamp(), _ts(r.end_at),
                        r.start_type in _LAUNCHES, _ts(r.first_output_at),
                        _began(r.start_at.timestamp(), relaunches or [])
                        if r.start_type == StartType.RELAUNCH else None) for r in records]
    incidents = [
        Incident(attempt=rr.attempt, detected=(rr.detected_at or rr.recover_start_at).timestamp(),
                 fault=_ts(rr.fault_at),
                 recovered=_ts(rr.first_progress_at) or (
                     _ts(rr.recover_end_at) if rr.recover_result == RecoverResult.FAILED
                     else None),
                 restarted=_acted(rr),
                 hang=rr.fault_scenario == FaultScenario.JOB_HANGED,
                 ends_attempt=rec.end_at is not None and (
                     rr.recover not in _IN_ATTEMPT or rr.recover_result not in _RESTARTED),
                 resumed_step=rr.resumed_step)
        for rec in records for rr in rec.recover_records]
    # a job that committed a checkpoint past step 0 with no step report at all reports none
    # (review 46 #1: NoProgressSignal never comes to a job whose checkpoints are its progress;
    # review 47 #5: a step-0 save before a step-reporting job's first step trained nothing;
    # review 48 #5: nor did a save of the step its attempt resumed from)
    since = resumed or {}
    no_steps = told_no_steps or shown_state(meta) == JobState.SUCCEEDED.value or (
        any(c.step and c.step > since.get(c.attempt if c.attempt is not None else -1, 0)
            for c in commits) and not samples)
    samples = samples + _commits_beyond(samples, commits)
    created = _meta_ts(meta.get("created_at"))
    start = created if created is not None else (
        attempts[0].start if attempts else now.timestamp())
    return LedgerInput(start=start, end=_end(meta, records, samples, last_event, now),
                       attempts=attempts, incidents=incidents, samples=samples,
                       saves=[(c.at - c.resumed_before_s, c.blocked_s) for c in commits
                              if c.blocked_s],
                       snapshots=[(r.at, r.blocked_s) for r in snapshots or ()],
                       hangs=hangs, queues=queues or [], stops=stops or [],
                       reports_no_steps=no_steps)


def _acted(rr: RecoverRecord) -> bool:
    """Whether the ladder acted on the incident, so that its time until the recovery ended
    is recovery whatever came of it: a recovery under way or done, or one whose workers
    started and failed again before any progress (walk-through 40 #5: the restart backoffs
    and the attempts that never reached a step read `other`, 57.7% of a failed job)."""
    return rr.recover != NO_RECOVERY and (rr.recover_result in _RESTARTED or (
        rr.recover_result == RecoverResult.FAILED and rr.workers_started_at is not None))


def _commits_beyond(samples: list[tuple[int, int, float]], commits: list[Save]
                    ) -> list[tuple[int, int, float]]:
    """Commits of steps past every step an attempt's samples reached, as samples: steps
    trained while no controller watched (a multi-node job's agents keep their commits for
    the next controller, not their steps: a job that finished then read 43 of 150 steps and
    13.5% goodput; walk-through 26), or the last step's save after its last sample."""
    top: dict[int, int] = {}
    for a, step, _ in samples:
        top[a] = max(step, top.get(a, step))
    out = []
    for c in commits:
        if c.attempt is not None and c.step is not None and c.step > top.get(c.attempt, -1) \
                and c.attempt in top:
            out.append((c.attempt, c.step, c.at))
            top[c.attempt] = c.step
    return out


def _began(start: float, relaunches: list[float]) -> float | None:
    """The latest relaunch that began before the attempt started."""
    return max((t for t in relaunches if t <= start), default=None)


def _end(meta: dict[str, object], records: list[RunningRecord],
         samples: list[tuple[int, int, float]], last_event: float | None,
         now: datetime) -> float:
    """The job's end: its end time; now while it runs; a lost launcher's last sign of life."""
    state = shown_state(meta)
    ended = _meta_ts(meta.get("ended_at"))
    if state in JOB_ENDED and ended is not None and state != JobState.LOST.value:
        return ended
    if state != JobState.LOST.value:
        return now.timestamp()
    last = last_sign_of_life(meta, records, samples[-1][2] if samples else None, last_event)
    return now.timestamp() if last is None else last


def _ts(t: datetime | None) -> float | None:
    return None if t is None else t.timestamp()


def _meta_ts(v: object) -> float | None:
    return _ts(from_iso(v)) if isinstance(v, str) else None
