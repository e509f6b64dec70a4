"""`trainguard diagnose JOB_DIR`: what a job dir gives the diagnosis. I/O.

The job store names the attempts and their ranks' exits. The attempt diagnosed is the one
asked for, else the last that failed (a rank failed, the controller confirmed a hang, a node
was lost, or a rank was restarted in place), else, when no attempt failed (each succeeded,
was stopped by the user or was lost with its launcher), none: nothing failed. An in-process
restart keeps the attempt and its ranks' rows (the restarted rank's row is its new process):
the failure it answered is read from the WorkerFailed events it recorded (the exits) and its
incident (the time span of its lines), so that its last one is diagnosed as the job
diagnosed it. An attempt a node loss ended blames the lost node (what its logs say is a
consequence: diagnosis.lost). Its rank logs are scanned (diagnosis.sources); when none of
its ranks failed but the controller confirmed a hang, that verdict (stacks/hang.json, with
every rank's stack dump) is the diagnosis.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from trainguard.backends.orphans import agents_seen
from trainguard.controller.faults import GROUP_FAILED_REASON, LOST_END_REASON, STOPPED_BY
from trainguard.controller.lost_launch import last_stamp
from trainguard.controller.shown import shown_state
from trainguard.controller.store import JobStore, db_path
from trainguard.controller.store_rows import log_dir_of
from trainguard.diagnosis.candidates import RankExit
from trainguard.diagnosis.hung import hang_diagnosis
from trainguard.diagnosis.lines import file_rank
from trainguard.diagnosis.lost import lost_node
from trainguard.diagnosis.sources import JobInputs, JobReader, log_files
from trainguard.diagnosis.taxonomy import Diagnosis
from trainguard.exitcodes import ExitCode
from trainguard.paths import HANG_FILE, STACKS_DIR, attempt_log_dir, rank_log_path, stacks_dir
from trainguard.records import (
    Event,
    FaultScenario,
    Reason,
    RecoverRecord,
    RecoverResult,
    RunningRecord,
    from_iso,
    rank_list,
)
from trainguard.states import JobState, WorkerState, shown_rank_state

# a NodeLost event's words: "node NAME was lost: WHY; what was done" (controller/nodes.py)
_LOST_WORDS = re.compile(r"node \S+ was lost: (.*); [^;]*$", re.DOTALL)


def job_reader(attempt: int | None) -> JobReader:
    """diagnosis.sources.diagnose_paths' reader of job dirs: `attempt`, or (None) the last
    that failed."""
    return lambda path, problems: read_job_dir(path, problems, attempt)


def read_job_dir(job_dir: Path, problems: list[str], attempt: int | None = None
                 ) -> JobInputs | None:
    """The attempt to diagnose, its log files, its ranks' exits and, when no rank failed
    but the launcher confirmed a hang, that hang's diagnosis. None: not a job dir."""
    if not db_path(job_dir).is_file():
        return None
    with JobStore.open(job_dir) as store:
        meta = store.meta()
        rows = store.all_workers()
        records = store.running_records()
        deaths = [e for _, e in store.events(reasons=(Reason.WORKER_FAILED.value,))]
        lost_events = [e for _, e in store.events(reasons=(Reason.NODE_LOST.value,))]
        # a lost job's ranks may train on: its nodes whose agent still runs (all of them
        # when Slurm cannot be asked: read as recorded, as `status` does; review 53 #6)
        nodes = store.nodes()
        agents = agents_seen(meta, nodes, shown_state(meta) == JobState.LOST.value)
        alive = agents.kept(n.name for n in nodes)
    if agents.unknown:
        problems.append(f"the launcher is gone, and of its node agents {agents.unknown}: "
                        "the job is read as recorded (its ranks may train on)")
    attempts = sorted({r.attempt for r in rows})
    log_dir = log_dir_of(meta, job_dir)
    if meta.get("exit_code") == ExitCode.NO_PROGRESS:  # whatever the verdict says of restarts
        problems.append(f"the job ended with exit {int(ExitCode.NO_PROGRESS)}: its attempts "
                        "kept failing without progress, so restarting did not help: fix the "
                        "cause before launching it again")
    losses = node_losses(records, lost_events)
    in_place = {rec.attempt: rrs for rec in records  # (the ones the rung carried out)
                if (rrs := [rr for rr in rec.recover_records if rr.recover == IN_PLACE
                            and rr.recover_result not in _NOT_CARRIED_OUT])}
    ended = {rec.attempt: rec.end_reason for rec in records}
    # lost, no relaunch closed it yet, no agent keeps its ranks (walk-through 38 #7: its logs
    # were read, a stop's SIGTERM a kill from outside; review 45 #3: agents still running)
    lost_job = shown_state(meta) == JobState.LOST.value
    if lost_job and not alive:
        ended.update({rec.attempt: LOST_END_REASON for rec in records
                      if rec.end_reason is None})
    # every rank exited 0: a hang confirmed as the ranks were ending is no failure
    ok = {a for a in attempts if all(r.state == WorkerState.SUCCEEDED
                                     for r in rows if r.attempt == a)}
    failed = sorted({r.attempt for r in rows if r.state == WorkerState.FAILED}
                    | {a for a in attempts if a not in ok
                       and (stacks_dir(log_dir, a) / HANG_FILE).is_file()}
                    | set(losses) | set(in_place))
    if attempt is None and not failed and attempts and all(
            _ended_well(ended.get(a)) for a in attempts):
        each = "; ".join(f"attempt {a} {_ended_well(ended.get(a))}" for a in attempts)
        return JobInputs(attempts[-1], [], [], None, failed=False,
                         note=f"no attempt of the job failed ({each})")
    if attempt is None:
        attempt = failed[-1] if failed else (attempts[-1] if attempts else 0)
    adir = attempt_log_dir(log_dir, attempt)
    files = [(p, _named(p, job_dir)) for p in (log_files(adir) if adir.is_dir() else [])
             if STACKS_DIR not in p.relative_to(adir).parts]  # stack dumps are not logs
    if not files:
        problems.append(f"{adir}: no logs of attempt {attempt} (known attempts: "
                        f"{', '.join(map(str, attempts)) or 'none'})")
    exits = [RankExit(r.rank, r.state == WorkerState.FAILED, r.exit_code, r.ended_at,
                      r.oom_killed, r.node, r.second_last_step_at,
                      stopped=r.state == WorkerState.STOPPED,
                      stopped_by=r.stopped_by.value if r.stopped_by else None)
             for r in rows if r.attempt == attempt]
    how = _ended_well(ended.get(attempt))
    note = None if attempt in failed or how is None else f"attempt {attempt} {how}"
    # some agents run on: the ranks of a node whose agent ended with the launcher are lost,
    # as status reads them (shown_rank_state), not failed (review 46 #2: a stop's SIGTERM in
    # their logs was diagnosed as a kill from outside)
    lost = JobState.LOST.value
    gone = sorted(r.rank for r in rows if r.attempt == attempt and lost_job and alive
                  and shown_rank_state(r.state, lost, r.node in alive) == lost)
    if gone:
        logs = {rank_log_path(log_dir, attempt, k).resolve() for k in gone}
        files = [f for f in files if f[0].resolve() not in logs]
        exits = [e for e in exits if e.rank not in gone]
        if attempt not in failed:
            note = (f"attempt {attempt}: rank(s) {rank_list(gone)} were lost with the launcher "
                    "(their node's agent ended with it); the others run on under their node "
                    "agents, for a controller to take the job over")
    restarts = in_place.get(attempt, [])
    window: tuple[datetime | None, datetime | None] = (None, None)
    if restarts:  # lines before its last in-process restart are an earlier failure's
        window = (_answered_until(restarts[-1]), None)
    if restarts and not any(e.failed for e in exits) and attempt not in losses:
        # it went on after its last in-process restart: that restart's failure is diagnosed
        last = restarts[-1]
        start = _answered_until(restarts[-2]) if len(restarts) > 1 else None
        window = (start, last.detected_at)
        died = _died(deaths, attempt, start, last.decided_at or last.recover_end_at)
        if not died and last.reason.startswith(GROUP_FAILED_REASON):
            # a broken group: every process lived, so each rank's row is its final one, with
            # its second-last step at the job's end, and the lines of the failure looked
            # survived (review 37 #8: "no failure found"); as a dead rank's, they stay
            exits = [replace(e, second_last_step_at=None) for e in exits]
        exits = [*died, *(e for e in exits if e.rank not in {d.rank for d in died})]
    if attempt in losses:  # each node lost (review 53 #7: the first only)
        return JobInputs(attempt, files, exits, None, lost=[
            (node, reason, sorted(r.rank for r in rows if r.attempt == attempt
                                  and r.node == node), not_blamed)
            for node, reason, not_blamed in losses[attempt]])
    hung, hang_files = (None, []) if any(e.failed for e in exits) else \
        _hang_report(job_dir, log_dir, attempt)
    # lost with its launcher: whose log just stopped (diagnosis.silent_peer)
    silent: dict[int, tuple[datetime, str | None]] = {}
    if ended.get(attempt) == LOST_END_REASON:
        silent = {r.rank: (at, r.node) for r in rows if r.attempt == attempt
                  and r.ended_at is None and r.rank not in gone and r.node not in alive
                  and (at := last_stamp(rank_log_path(log_dir, attempt, r.rank))) is not None}
    return JobInputs(attempt, files, exits, hung, hang_files, window=window, failed=note is None,
                     note=note, silent=silent)


IN_PLACE = "in_process_restart"  # a recover record's `recover` for rung 1a
# an in-process record whose rung did not act (downgraded to a process restart, no budget
# left): its failure is the attempt's own, diagnosed from all of its lines
_NOT_CARRIED_OUT = (RecoverResult.DOWNGRADE, RecoverResult.QUOTA_EXCEEDED)


def _answered_until(rr: RecoverRecord) -> datetime | None:
    """Until when a log line can be the failure an in-process restart answered: the first
    step after it when it recovered; else when it began (a restart that made no progress
    is closed at the next failure's detection, whose own lines came after it began: review
    36 #7, a window from the close left that failure no line)."""
    if rr.recover_result == RecoverResult.SUCCESS:
        return rr.recover_end_at or rr.detected_at
    return rr.workers_started_at or rr.decided_at or rr.detected_at
_SIGNALS = {s.name for s in signal.Signals}
_EXIT_WORDS = re.compile(r"killed by (SIG[A-Z0-9]+)|exited with code (-?\d+)")


def _named(p: Path, job_dir: Path) -> str:
    """A file as the job's events name it: relative to the job dir (however the job dir was
    given), else its whole path."""
    inside, root = p.resolve(), job_dir.resolve()
    return str(inside.relative_to(root)) if inside.is_relative_to(root) else str(p)


def _ended_well(end_reason: str | None) -> str | None:
    """How an attempt that did not fail ended, from its record's end_reason; None: it failed
    (or its end is unknown)."""
    if end_reason == JobState.SUCCEEDED.value:  # controller/incidents.py attempt_succeeded
        return JobState.SUCCEEDED.value
    if end_reason is not None and end_reason.startswith(STOPPED_BY):
        return f"was stopped by the user: {end_reason}"
    if end_reason == LOST_END_REASON:  # `stop --force`, or the launcher crashed: no rank failed
        return "was lost with its launcher, killed or crashed, and its ranks with it"
    return None


def _died(deaths: list[Event], attempt: int, after: datetime | None,
          until: datetime | None) -> list[RankExit]:
    """The ranks of `attempt` whose process failed between `after` and `until` (the failure
    an in-process restart answered), from the WorkerFailed events: their data (exit code,
    OOM kill, end), else (a store written before they had data) their message."""
    out = []
    for ev in deaths:
        rank = ev.involved.rank
        if (ev.involved.attempt != attempt or rank is None or (after and ev.time <= after)
                or (until and ev.time > until)):
            continue
        data = ev.data or {}
        code = data.get("exit_code")
        if not isinstance(code, int):
            m = _EXIT_WORDS.search(ev.message)
            sig = signal.Signals[m.group(1)].value if m and m.group(1) in _SIGNALS else None
            code = -sig if sig else int(m.group(2)) if m and m.group(2) else None
        oom = data.get("oom_killed")
        ended = data.get("ended_at")
        out.append(RankExit(rank, True, code, from_iso(ended) if isinstance(ended, str)
                            else ev.time, oom if isinstance(oom, bool) else None,
                            data.get("node") or ev.involved.node))
    return out


def node_losses(records: list[RunningRecord], lost: list[Event]
                ) -> dict[int, list[tuple[str, str, str | None]]]:
    """attempt -> each node lost (the node, how the launcher lost it, why the node is not
    blamed when it is not), for attempts a node loss ended. How: its NodeLost event's data
    (the recover record's reason is the ladder's, a downgrade's words: "no spare node to
    replace it with"), else (a store older than the data) the event's words, else that
    reason."""
    said = {(e.involved.attempt, e.involved.node): e for e in lost}
    out: dict[int, list[tuple[str, str, str | None]]] = {}
    for rec in records:
        seen: set[str] = set()  # (a node's second record: a downgrade, then the next rung)
        for rr in rec.recover_records:
            node = lost_node(rr.related_task)
            if rr.fault_scenario != FaultScenario.NODE_FAULT or node is None or node in seen:
                continue
            seen.add(node)
            ev = said.get((rec.attempt, node))
            data = (ev.data or {}) if ev is not None else {}
            why, kept = data.get("why"), data.get("not_blamed")
            if not isinstance(why, str):
                m = _LOST_WORDS.match(ev.message) if ev is not None else None
                why = m.group(1) if m else rr.reason
            out.setdefault(rec.attempt, []).append(
                (node, why, kept if isinstance(kept, str) else None))
    return out


def _hang_report(job_dir: Path, log_dir: Path, attempt: int
                 ) -> tuple[Diagnosis | None, list[str]]:
    """The launcher's hang verdict of `attempt`, with its stack dumps, if it hung; and the
    files it read (the verdict and the dumps, as shown)."""
    path = stacks_dir(log_dir, attempt) / HANG_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, []
    if not isinstance(data, dict) or data.get("cleared_at"):
        return None, []  # the job made progress again after that hang
    texts = {}
    for f in sorted(path.parent.glob("rank-*.txt")):
        rank = file_rank(f.name)
        if rank is not None:
            name = _named(f, job_dir)
            with contextlib.suppress(OSError):
                texts[rank] = (name, f.read_text(encoding="utf-8", errors="replace"))
    read = [_named(path, job_dir), *(name for name, _ in texts.values())]
    return hang_diagnosis(data, texts), read
