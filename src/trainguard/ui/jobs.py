"""What the dashboard shows of one job, as JSON-ready dicts: a row of the job list, and the
job view (attempts with their recover records, workers, nodes, checkpoints, diagnoses,
hangs). Read-only over the job store; every read is bounded (ui/eventlog.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from trainguard.backends.orphans import agents_seen
from trainguard.controller.shown import LAUNCH_REASONS, last_progress, shown_state, stop_under_way
from trainguard.controller.store import JobStore
from trainguard.controller.store_rows import NodeRow, WorkerRow, log_dir_of, to_row
from trainguard.errors import StoreError
from trainguard.records import (
    Event,
    Reason,
    RunningRecord,
    incidents_of,
    recoveries_by_rung,
    size_text,
)
from trainguard.states import JOB_ENDED, JobState, exit_seen, shown_node, shown_rank_state
from trainguard.ui.eventlog import EventLog
from trainguard.ui.goodput_view import GoodputCache
from trainguard.ui.jobfiles import Refused, check_store

RECENT_CHECKPOINTS = 50
RECENT_INCIDENTS = 100
_SAVED = re.compile(r"checkpoint of step (-?\d+) committed at (.*?)(?: \((.*)\))?(?:;.*)?$")
_BLOCKED = re.compile(r"loop blocked ([\d.]+)s")
_WRITTEN = re.compile(r"written in ([\d.]+)s")
_MIB = re.compile(r"([\d.]+) MiB")
_META_SHOWN = ("run_id", "created_at", "ended_at", "exit_code", "command", "nproc_per_node",
               "max_restarts", "restarts_used", "hang_restarts", "launches", "scenario",
               "log_dir", "last_step", "last_progress_at", "attempt", "launcher_host")


def is_ended(state: str | None) -> bool:
    return state in JOB_ENDED


def summary(jid: str, job_dir: Path, goodput: GoodputCache) -> dict[str, Any]:
    """A row of the job list; a job dir that cannot be read becomes a row with `error`."""
    try:
        check_store(job_dir)
        with JobStore.open(job_dir) as store, EventLog(job_dir) as log:
            meta = store.meta()
            ratio = goodput_for(goodput, job_dir, store, meta, log.last_id()).get("goodput")
            return {**_summary(jid, job_dir, meta, store.running_records(), ratio),
                    **_progress(store, meta), "hang": store.hang_left_running(meta),
                    "stopping": _stopping(store, meta)}
    except (StoreError, Refused) as e:
        return {"id": jid, "job_dir": str(job_dir), "error": str(e), "state": None}


def goodput_for(goodput: GoodputCache, job_dir: Path, store: JobStore, meta: dict[str, Any],
                last_event: int) -> dict[str, Any]:
    """The job's goodput, computed again only when its store says something new."""
    state = shown_state(meta)
    return goodput.get(job_dir, store, (last_event, state, meta.get("ended_at"),
                                        meta.get("last_progress_at")), is_ended(state))


def _summary(jid: str, job_dir: Path, meta: dict[str, Any], records: list[RunningRecord],
             ratio: float | None) -> dict[str, Any]:
    state = shown_state(meta)
    return {
        "id": jid, "job_dir": str(job_dir), "run_id": meta.get("run_id"), "state": state,
        "ended": is_ended(state), "attempts": len(records),
        "restarts": sum(recoveries_by_rung(records).values()),  # as `status` counts them
        "incidents": len(incidents_of(records)),  # one per fault, as `recovery`
        "created_at": meta.get("created_at"), "ended_at": meta.get("ended_at"),
        "goodput": ratio, "error": None,
    }


def detail(jid: str, job_dir: Path, goodput: GoodputCache) -> dict[str, Any]:
    """The job view's data (StoreError when the store cannot be read)."""
    with JobStore.open(job_dir) as store, EventLog(job_dir) as log:
        meta = store.meta()
        records = store.running_records()
        last = log.last_id()
        ledger = goodput_for(goodput, job_dir, store, meta, last)
        doc = _summary(jid, job_dir, meta, records, ledger.get("goodput"))
        doc.update(live_parts(store, meta, records))
        doc["meta"] = {k: meta.get(k) for k in _META_SHOWN if k in meta}
        doc["log_dir"] = str(log_dir_of(meta, job_dir))
        doc["checkpoints"] = checkpoints(log)
        doc["diagnoses"] = [diagnosis_item(i, e) for i, e in
                            log.newest(RECENT_INCIDENTS, [Reason.FAILURE_DIAGNOSED.value])]
        doc["hangs"] = [hang_item(i, e) for i, e in
                        log.newest(RECENT_INCIDENTS, [Reason.HANG_CONFIRMED.value])]
        doc["last_event_id"] = last
        doc["events_total"] = log.count()
        doc["goodput_detail"] = ledger
    return doc


def live_parts(store: JobStore, meta: dict[str, Any],
               records: list[RunningRecord]) -> dict[str, Any]:
    """What changes while a job runs, without its events: state, attempts, ranks, nodes
    (pushed on the live stream whenever it changes)."""
    state = shown_state(meta)
    return {
        "state": state, "ended": is_ended(state), "attempts": len(records),
        "hang": store.hang_left_running(meta), **_progress(store, meta),
        "stopping": _stopping(store, meta),
        "records": [r.to_dict() for r in records],
        **_ranks_and_nodes(store, meta, state),
    }


def _progress(store: JobStore, meta: dict[str, Any]) -> dict[str, Any]:
    """The last progress as `status` and `ls` show it: the last step reported, or the last
    committed checkpoint's when it is further (`progress_source`: "step" or "checkpoint";
    walk-through 38 #2: a job that reports no steps read '-' here only)."""
    p = last_progress(meta, store.last_checkpoint())
    return {"last_step": p["step"], "last_progress_at": p["time"], "progress_source": p["source"]}


def _stopping(store: JobStore, meta: dict[str, Any]) -> dict[str, Any] | None:
    """A stop under way, as `status`'s STOPPING (one indexed read of the newest launch
    event: the dashboard asks per row every few seconds)."""
    return stop_under_way(shown_state(meta), store.last_event(LAUNCH_REASONS))


def _ranks_and_nodes(store: JobStore, meta: dict[str, Any],
                     job_state: str | None) -> dict[str, Any]:
    """The ranks and nodes as `status` shows them: a lost job's read `lost` unless their
    agent still runs (walk-through 38 #6: the dashboard said `running` of processes gone
    with their launcher; walk-through 42: a node down since read `healthy`), with the
    agents that still run and why Slurm could not say (review 54 #7: the dashboard kept the
    recorded states then and said nothing)."""
    nodes = store.nodes()
    agents = agents_seen(meta, nodes, job_state == JobState.LOST.value)
    kept = agents.kept(n.name for n in nodes)
    return {
        "agents_without_controller": agents.alive, "agents_unknown": agents.unknown,
        "workers": [{**row, "state": shown_rank_state(row["state"], job_state, w.node in kept,
                                                      exit_seen(w.exit_code, w.signal))}
                    for w in store.workers() for row in (row_dict(w),)],
        "nodes": [{**row, **dict(zip(("state", "reason"), shown_node(
            row["state"], row["reason"], job_state, n.name in kept), strict=True))}
                  for n in nodes for row in (row_dict(n),)]}


def row_dict(row: WorkerRow | NodeRow) -> dict[str, Any]:
    names = [f for f in row.__dataclass_fields__]
    return dict(zip(names, to_row(row), strict=True))


def checkpoints(log: EventLog) -> dict[str, Any]:
    """The newest committed checkpoints, from CheckpointSaved events, and how many."""
    reason = [Reason.CHECKPOINT_SAVED.value]
    items = [checkpoint_item(i, e) for i, e in log.newest(RECENT_CHECKPOINTS, reason)]
    return {"count": log.count(reason), "items": items[::-1]}


def checkpoint_item(eid: int, ev: Event) -> dict[str, Any]:
    """A committed checkpoint: from the event's data, or (stores before it had data) from
    its message."""
    m = _SAVED.match(ev.message)
    how = (m.group(3) or "") if m else ""
    d = ev.data or {}
    size = d.get("bytes")
    return {"id": eid, "time": ev.to_dict()["time"], "attempt": ev.involved.attempt,
            "step": d.get("step", int(m.group(1)) if m else None),
            "location": d.get("location", m.group(2) if m else None),
            "blocked_s": d.get("blocked_s", _num(_BLOCKED, how)),
            "write_s": d.get("write_s", _num(_WRITTEN, how)),
            "mib": round(size / 2**20, 4) if isinstance(size, int | float) else _num(_MIB, how),
            # as the CLI says it (walk-through 40 #9: 44.9 KiB read 0.0 MiB)
            "size": size_text(size) if isinstance(size, int | float) else None,
            "source": d.get("source"), "message": ev.message}


def _num(pattern: re.Pattern[str], text: str) -> float | None:
    m = pattern.search(text)
    return float(m.group(1)) if m else None


def diagnosis_item(eid: int, ev: Event) -> dict[str, Any]:
    return {"id": eid, "time": ev.to_dict()["time"], "attempt": ev.involved.attempt,
            "rank": ev.involved.rank, "message": ev.message, "diagnosis": ev.data or {}}


def hang_item(eid: int, ev: Event) -> dict[str, Any]:
    data = ev.data or {}
    return {"id": eid, "time": ev.to_dict()["time"], "attempt": ev.involved.attempt,
            "message": ev.message, "culprit": data.get("culprit"),
            "stuck_ranks": data.get("stuck_ranks"), "idle_s": data.get("idle_s"),
            "threshold_s": data.get("threshold_s"), "basis": data.get("basis"),
            "stacks": data.get("stacks") or {}, "stack_errors": data.get("stack_errors") or {}}
