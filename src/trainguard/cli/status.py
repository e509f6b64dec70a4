"""`trainguard status JOB_DIR [--json]`: the job's state as it is, not as last recorded.

Besides the recorded state it shows what a user needs while the job runs: a confirmed hang
left running, the launcher's pid (to stop the job), every recovery whatever the rung that
made it (worded by rung: a step re-execution restarts no process), each budget of the
ladder, and `lost` ranks when the launcher is gone; nothing live once the job ended.
"""

from __future__ import annotations

import argparse
import shutil
from enum import Enum
from typing import Any

from rich.table import Table
from rich.text import Text

from trainguard.backends.orphans import AgentsSeen, agents_seen
from trainguard.cli.fmt import (
    clock,
    clock_or_dash,
    console_out,
    dash,
    meta_time,
    print_json,
    print_table,
    size_text,
)
from trainguard.cli.status_nodes import print_nodes, refused, usage
from trainguard.controller.shown import (
    HANG_REASONS,
    LAUNCH_REASONS,
    hang_left_running,
    last_progress,
    launcher_dead,
    shown_state,
    stop_under_way,
)
from trainguard.controller.store import JobStore, NodeRow, WorkerRow
from trainguard.controller.store_rows import node_order
from trainguard.exitcodes import ExitCode
from trainguard.policy.decision import Rung
from trainguard.protocol import AgentConfig
from trainguard.records import (
    NO_RECOVERY,
    Event,
    RecoverResult,
    RunningRecord,
    iso,
    rank_list,
    recoveries_by_rung,
    recoveries_text,
)
from trainguard.states import (
    JOB_ENDED,
    JobState,
    NodeState,
    WorkerState,
    exit_seen,
    shown_node,
    shown_rank_state,
)

# less free than this on the job dir's disk: a running job's store writes fail (a page, its
# journal, the WAL) and status may read behind (walk-through 24)
STORE_FULL_BYTES = 1 << 20
_ORPHAN_S = AgentConfig.model_fields["orphan_timeout_s"].default
_STATE_STYLES: dict[str, str] = {  # of workers, then of nodes
    WorkerState.STARTING: "cyan", WorkerState.RUNNING: "green",
    WorkerState.SUCCEEDED: "green", WorkerState.FAILED: "bold red",
    WorkerState.STOPPED: "yellow", NodeState.HEALTHY: "green", NodeState.SPARE: "cyan",
    NodeState.LOST: "bold red", NodeState.ISOLATED: "yellow", "lost": "bold red",
}
# how `status` and `ls` say where the last progress comes from (store_rows.last_progress)
PROGRESS_SOURCES = {"checkpoint": " (last committed checkpoint; the job reports no steps)",
                    # a checkpoint beyond the last step recorded (no controller watched)
                    "checkpoint_beyond": " (last committed checkpoint, beyond the last step "
                    "recorded)"}
# (budget name, meta key of what is used, meta key of the maximum in `budgets`)
_BUDGETS = (("restarts", "restarts_used", "max_restarts"),
            ("hang_restarts_in_a_row", "hang_restarts", "max_hang_restarts"),
            ("step_retries", "step_retries_used", "max_step_retries"),
            ("pod_reschedules", "pod_reschedules_used", "max_pod_reschedules"),
            ("job_reschedules", "job_reschedules_used", "max_job_reschedules"))


def print_status(store: JobStore, args: argparse.Namespace) -> int:
    meta = store.meta()
    hang_events = [ev for _, ev in store.events(reasons=HANG_REASONS)]
    nodes = store.nodes()
    lost = shown_state(meta) == JobState.LOST.value
    doc = status_doc(meta, store.workers(), str(store.job_dir.resolve()), nodes,
                     store.running_records(), hang_events, store.last_checkpoint(),
                     store.last_event(LAUNCH_REASONS), _free_bytes(store),
                     agents_seen(meta, nodes, lost))
    if args.json:
        print_json(doc)
        return ExitCode.SUCCESS
    console = console_out()
    state = dash(doc["state"]) + (" · HUNG (confirmed, left running)" if doc["hang"] else "") \
        + (" · STOPPING" if doc["stopping"] else "")
    console.print(Text(f"run {doc['run_id']} · {state} · attempt {dash(doc['attempt'])}",
                       "bold red" if doc["hang"] else "bold")
                  + Text(f" · {recoveries_text(doc['restarts_by_rung'])}"))
    progress = doc["last_progress"]
    at = meta_time(progress["time"])
    when = "never" if at is None else f"at {clock(at)}"
    source = PROGRESS_SOURCES.get("checkpoint_beyond" if progress["source"] == "checkpoint"
                                  and meta.get("last_step") is not None
                                  else progress["source"], "")
    console.print(f"last progress: step {dash(progress['step'])} {when}{source}",
                  highlight=False)
    for m in doc["training"]:
        console.print(f"train metrics: rank {m['rank']} at step {m['step']}: loss "
                      f"{_metric(m['loss'])}, learning rate {_metric(m['learning_rate'])}",
                      highlight=False)
    if doc["hang"]:
        h = doc["hang"]
        console.print(f"hang: confirmed at {clock_or_dash(h['confirmed_at'])} on rank(s) "
                      f"{rank_list(h['ranks'])}; culprit: {h['culprit']}", highlight=False)
    if doc["agents_without_controller"]:
        console.print(f"no controller: the launcher is gone, but the node agents of "
                      f"{', '.join(doc['agents_without_controller'])} still run, and their "
                      "workers train on unrecorded (an agent ends them after "
                      f"{_ORPHAN_S / 60:g} min without a controller): run the same `trainguard "
                      f"run` command with --job-dir {doc['job_dir']} to take the job over "
                      f"without a restart, or `trainguard stop {doc['job_dir']}` to end them",
                      style="bold yellow", highlight=False, markup=False)
    if doc["agents_unknown"]:
        console.print(f"no controller: the launcher is gone, and of its node agents "
                      f"{doc['agents_unknown']}: the nodes and ranks below show their last "
                      "recorded states", style="bold yellow", highlight=False, markup=False)
    if doc["stopping"]:
        st = doc["stopping"]
        grace = f"{st['grace_s']:g}" if isinstance(st["grace_s"], (int, float)) else "-"
        console.print(f"stopping: requested at {clock_or_dash(st['requested_at'])} "
                      f"({dash(st['signal'])}); the ranks have {grace}s to exit, then "
                      "SIGKILL", highlight=False)
    if doc["store_disk_full"]:
        console.print(f"store: the job dir's disk has {size_text(doc['store_free_bytes'])} "
                      "free: the launcher cannot write the job's store, so this status may be "
                      "behind (the launcher's console says StoreWriteFailed); free space on it "
                      "and the job writes what waited", style="bold red", highlight=False,
                      markup=False)
    launcher = doc["launcher"]
    gone = " (gone)" if launcher["alive"] is False else ""
    console.print(f"launcher: pid {dash(launcher['pid'])} on {dash(launcher['host'])}{gone}"
                  + ("" if gone or launcher["pid"] is None or doc["stopping"] or
                     doc["state"] in JOB_ENDED else  # its pid outlives the job, or is reused
                     f"  (stop the job: trainguard stop {doc['job_dir']})"), highlight=False)
    budgets = "  ".join(f"{name} off" if name in doc["budgets_off"] else
                        f"{name} {b['used']}/{dash(b['max'])}"
                        for name, b in doc["budgets"].items())
    console.print(f"budgets: {budgets}", highlight=False)
    if doc["exit_code"] == ExitCode.NO_PROGRESS:
        console.print(f"ended: exit {int(ExitCode.NO_PROGRESS)}, attempts kept failing without "
                      "progress: do not requeue it as it is; `trainguard diagnose "
                      f"{doc['job_dir']}` names the cause to fix first", highlight=False,
                      markup=False)
    elif doc["state"] in _CONTINUABLE and not doc["agents_without_controller"]:
        first = (f"once its cause is fixed (`trainguard diagnose {doc['job_dir']}`), "
                 if doc["state"] == JobState.FAILED.value else "")
        console.print(f"continue it: {first}run the same `trainguard run` command with "
                      f"--job-dir {doc['job_dir']} (it resumes from the newest checkpoint, or "
                      f"starts over if none was saved){_restart_hint(doc)}", highlight=False,
                      markup=False)
    moved = doc["recorded_job_dir"]
    console.print(f"job dir: {doc['job_dir']}" + (f" (recorded at {moved}: copied or moved "
                                                  "since)" if moved else ""),
                  highlight=False, markup=False)
    print_nodes(console, doc)
    if doc["nodes"]:
        print_table(keyed_table(doc["nodes"], _NODE_KEYS))
        console.print()
    # a rank ended by a signal: the SIGNAL column says which (JSON keeps Python's -N); a
    # rank of a confirmed hang left running reads `running (hung)`
    rows = [{**r, "exit_code": None} if isinstance(r["exit_code"], int) and r["exit_code"] < 0
            else r for r in doc["ranks"]]
    print_table(keyed_table([{**r, "state": f"{r['state']} (hung)"} if r.get("hung") else r
                             for r in rows], _RANK_KEYS))
    return ExitCode.SUCCESS


def status_doc(meta: dict[str, Any], workers: list[WorkerRow], job_dir: str,
               nodes: list[NodeRow] | None = None, records: list[RunningRecord] | None = None,
               hang_events: list[Event] | None = None,
               checkpoint: tuple[int, str] | None = None,
               last_launch: Event | None = None,
               free_bytes: int | None = None,
               agents: AgentsSeen | None = None) -> dict[str, Any]:
    """The `status --json` document; `nodes` is empty for a single-node job;
    `checkpoint`: (step, time) of the last committed one, the progress of a job that
    reports no steps; `job_dir`: the one read (resolved), shown even when the store was
    written elsewhere; `free_bytes`: free on the job dir's disk (None: unknown), where a
    running job's store writes fail when it is full (what this reads may be behind);
    `agents`: a lost job's node agents that still run (they outlive a killed launcher,
    waiting for a controller to take the job over: their ranks train on), or why Slurm
    could not say which."""
    state = shown_state(meta)
    agents = agents or AgentsSeen()
    kept = agents.kept(n.name for n in nodes or [])
    by_rung = recoveries_by_rung(records or [])
    progress = last_progress(meta, checkpoint)
    hang = hang_left_running(state, meta.get("attempt"), hang_events or [])
    hung = set((hang or {}).get("ranks") or [])
    return {
        "run_id": meta.get("run_id"),
        "state": state,
        "attempt": meta.get("attempt"),
        "exit_code": meta.get("exit_code") if state in JOB_ENDED else None,
        "restarts": sum(by_rung.values()),
        "restarts_by_rung": by_rung,
        "ended_by": _ended_by(state, records or []),
        "restarts_used": meta.get("restarts_used"),
        "max_restarts": meta.get("max_restarts"),
        "budgets": _budgets(meta),
        "budgets_off": _budgets_off(meta),
        "hang": hang,
        "stopping": stop_under_way(state, last_launch),
        "launcher": {"pid": meta.get("launcher_pid"), "host": meta.get("launcher_host"),
                     "alive": None if meta.get("launcher_pid") is None
                     else not launcher_dead(meta)},
        "last_progress": {**progress, "time": iso(meta_time(progress["time"]))},
        "training": _training(meta.get("training")),
        "ranks": [_rank_dict(w, state, hung, kept)
                  for w in sorted(workers, key=lambda w: w.rank)],
        "agents_without_controller": agents.alive,
        "agents_unknown": agents.unknown,
        "job_dir": job_dir,
        "recorded_job_dir": _elsewhere(meta.get("job_dir"), job_dir),
        "nodes": [_node_dict(n, state, kept) for n in sorted(nodes or [], key=node_order)],
        "node_usage": [] if state in JOB_ENDED else usage(meta.get("node_usage")),
        **refused(meta),
        "store_free_bytes": free_bytes,
        "store_disk_full": state not in JOB_ENDED and free_bytes is not None
        and free_bytes < STORE_FULL_BYTES,
    }


def _free_bytes(store: JobStore) -> int | None:
    try:
        return shutil.disk_usage(store.job_dir).free
    except OSError:
        return None


_NODE_RUNGS = (Rung.POD_RESCHEDULE.value, Rung.JOB_RESCHEDULE.value)


def _ended_by(state: str | None, records: list[RunningRecord]) -> str | None:
    """The rung whose failure ended a failed job (None: another end, or no rung acted)."""
    if state != JobState.FAILED.value or not records or not records[-1].recover_records:
        return None
    last = records[-1].recover_records[-1]
    if last.recover == NO_RECOVERY:  # no rung acted (a user error, a spent budget): not a
        return None  # rung named "none" (walk-through 30)
    return last.recover if last.recover_result in (RecoverResult.FAILED,
                                                   RecoverResult.QUOTA_EXCEEDED) else None


def _elsewhere(recorded: Any, job_dir: str) -> str | None:
    """The job dir the store was written in, when it is not the one read (a copied or
    moved job dir: its files are read where it is now, store_rows.moved_with_job_dir)."""
    if not isinstance(recorded, str) or not recorded or recorded == job_dir:
        return None
    return recorded


def _training(recorded: Any) -> list[dict[str, Any]]:
    """Per reporting rank, the loss and learning rate it logged last (None: NaN/inf)."""
    if not isinstance(recorded, dict):
        return []
    return [{"rank": int(r), "step": v.get("step"), "loss": v.get("loss"),
             "learning_rate": v.get("learning_rate"), "time": v.get("at")}
            for r, v in sorted(recorded.items(), key=lambda kv: int(kv[0]))
            if isinstance(v, dict)]


def _budgets(meta: dict[str, Any]) -> dict[str, dict[str, Any]]:
    limits = meta.get("budgets") if isinstance(meta.get("budgets"), dict) else {}
    limits = {"max_restarts": meta.get("max_restarts"), **(limits or {})}
    return {name: {"used": int(meta.get(used) or 0), "max": limits.get(limit)}
            for name, used, limit in _BUDGETS}


def _restart_hint(doc: dict[str, Any]) -> str:
    """For a failed job whose restarts were off or spent: the flag that changes that (the
    JobFailed event names it; the advice under `status` did not)."""
    if doc["state"] != JobState.FAILED.value or doc["attempt"] is None:
        return ""  # (None: no attempt started, as after a pre-check that failed everywhere)
    spent = [name for name in ("pod_reschedules", "job_reschedules")
             if isinstance(doc["budgets"][name]["max"], int)
             and doc["budgets"][name]["used"] >= doc["budgets"][name]["max"]]
    if doc["ended_by"] in _NODE_RUNGS and "job_reschedules" in spent:
        flags = " and ".join(f"--max-{name.replace('_', '-')}" for name in spent)
        return (f"; its node reschedules were spent: give {flags} more than it used (they "
                "are counted across relaunches of the job dir, unlike --max-restarts: the "
                "same command has none left)")
    if doc["ended_by"] in _NODE_RUNGS:
        return ("; it ended out of healthy nodes (--max-restarts does not cover that): "
                "--spare-nodes N keeps nodes ready for a lost node's ranks, a longer "
                "--queue-timeout waits for one to come back")
    b = doc["budgets"]["restarts"]
    if b["max"] == 0:
        return ("; auto restart was off (--max-restarts 0): give --max-restarts N for a fault "
                "like this one to be restarted by itself")
    if isinstance(b["max"], int) and b["used"] >= b["max"]:
        return (f"; its {b['max']} restart(s) were spent: a larger --max-restarts gives it more "
                "(a fault that repeats wants its cause fixed first)")
    return ""


def _budgets_off(meta: dict[str, Any]) -> list[str]:
    """The budgets of rungs the job does not use (--restart-on-hang, --operator-reexecution
    off); [] for a store written before they were recorded."""
    off = meta.get("budgets_off")
    return [str(n) for n in off] if isinstance(off, list) else []


def _metric(value: Any) -> str:
    """A logged loss or learning rate as a logger shows it (6 significant digits; the JSON
    keeps every one): 2.57868, not 2.5786819458007812."""
    return f"{value:.6g}" if isinstance(value, float) else dash(value)


# a job that ended without succeeding: launched again on its job dir, it goes on
_CONTINUABLE = frozenset({JobState.FAILED.value, JobState.STOPPED.value, JobState.LOST.value})

_RANK_KEYS = ("rank", "local_rank", "node", "pid", "state", "exit_code", "signal", "start_count")
_NODE_KEYS = ("name", "host", "state", "agent_pid", "slot", "backend", "times_implicated",
              "updated_at", "reason")


def _rank_dict(w: WorkerRow, job_state: str | None, hung: set[int],
               kept: set[str]) -> dict[str, Any]:
    """A rank's row; a rank not ended when its launcher died reads `lost` (the guardian
    killed it with the launcher: nothing recorded its end), but as recorded on a node whose
    agent still runs (it keeps its workers for a takeover); `hung`: a running rank of a
    confirmed hang left running."""
    d = {k: _plain(getattr(w, k)) for k in _RANK_KEYS}
    d["state"] = shown_rank_state(d["state"], job_state, w.node in kept,
                                  exit_seen(w.exit_code, w.signal))
    d["hung"] = w.rank in hung and d["state"] == WorkerState.RUNNING.value
    return d


def _node_dict(n: NodeRow, job_state: str | None, alive: set[str]) -> dict[str, Any]:
    d = {k: iso(n.updated_at) if k == "updated_at" else _plain(getattr(n, k))
         for k in _NODE_KEYS}
    d["state"], d["reason"] = shown_node(str(d["state"]), n.reason, job_state, n.name in alive)
    return d


def _plain(v: Any) -> Any:
    """A state as its stored string (the JSON document and the table show values)."""
    return v.value if isinstance(v, Enum) else v


def keyed_table(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> Table:
    """One column per key (a time as its clock), the state styled; a reason may wrap."""
    table = Table(box=None, pad_edge=False)
    for key in keys:
        table.add_column(key.upper().replace("_", " "), no_wrap=key != "reason")
    for r in rows:
        cells = [Text(clock_or_dash(r[k]) if k.endswith("_at") else dash(r[k])) for k in keys]
        cells[keys.index("state")].stylize(_STATE_STYLES.get(r["state"], ""))
        table.add_row(*cells)
    return table
