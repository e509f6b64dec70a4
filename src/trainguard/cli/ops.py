"""`trainguard stop JOB_DIR` and `trainguard ls [ROOT]`: the everyday commands around a job
(the ones people otherwise do with `kill` and `ls`); `trainguard prune` is in cli/prune.py
(registered here, with them).

`stop` sends SIGTERM to the job's launcher, the same as Ctrl-C in its terminal: the launcher
stops every worker on every node with the grace period (`--grace-period`), records
`JobStopped` and exits 143. It refuses a pid that is no longer a trainguard launcher.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import socket
import time
from pathlib import Path
from typing import Any

import psutil
from rich.table import Table

from trainguard.backends.orphans import SLURM_JOB_KEY, end_agents
from trainguard.cli.args import seconds
from trainguard.cli.fmt import clock_or_dash, complain, dash, print_json, print_table, size_text
from trainguard.cli.job_rows import job_row, when
from trainguard.cli.prune import add_prune_command
from trainguard.cli.read import add_job_dir
from trainguard.cli.unwatched import record_unwatched
from trainguard.controller.shown import LAUNCH_REASONS, shown_state, stop_under_way
from trainguard.controller.store import JobStore
from trainguard.errors import StoreError
from trainguard.exitcodes import ExitCode
from trainguard.paths import DEFAULT_RUNS_DIR
from trainguard.states import JOB_ENDED, JobState
from trainguard.ui.catalog import find_job_dirs

STOP_POLL_S = 0.2


def add_ops_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("stop", help="stop a running job gracefully (every node, with the grace "
                       "period), as Ctrl-C in its terminal would",
                       description="Send SIGTERM to the job's launcher: it stops every worker "
                       "on every node (SIGTERM, the grace period, then SIGKILL), records "
                       "JobStopped and exits. Waits for it to end.")
    add_job_dir(p, newest_by_default=False)
    p.add_argument("--timeout", type=seconds, default=120.0,
                   help="seconds to wait for the launcher to end (120)")
    p.add_argument("--now", action="store_true", help="a stop already under way: end the "
                   "ranks' grace period at once (a second SIGTERM: what still runs, on every "
                   "node, gets SIGKILL)")
    p.add_argument("--force", action="store_true", help="SIGKILL the launcher if it has not "
                   "ended within --timeout (its guardian then kills the workers, and a "
                   "multi-node job's agents on this machine are killed too; the job reads "
                   "`lost`)")
    p.set_defaults(func=cmd_stop)
    ls = sub.add_parser("ls", help="list the jobs under a directory",
                        description="Every job dir under ROOT (two levels deep): state, "
                        "attempts, last step and progress, and size on disk.")
    ls.add_argument("root", metavar="ROOT", nargs="?", default=DEFAULT_RUNS_DIR,
                    help=f"where to look (default: ./{DEFAULT_RUNS_DIR}, where `trainguard "
                    "run` puts a job given no --job-dir)")
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ls.set_defaults(func=cmd_ls)
    add_prune_command(sub)


# -- stop ---------------------------------------------------------------------------------


def cmd_stop(args: argparse.Namespace) -> int:
    try:
        with JobStore.open(Path(args.job_dir)) as store:
            meta = store.meta()
            under_way = stop_under_way(shown_state(meta), store.last_event(LAUNCH_REASONS))
    except StoreError as e:
        complain("stop", str(e))
        return ExitCode.NO_JOB
    state = shown_state(meta)
    if state in JOB_ENDED:
        ended, unknown = _end_agents(Path(args.job_dir)) if state == JobState.LOST.value \
            else ([], None)
        found = record_unwatched(Path(args.job_dir)) if state == JobState.LOST.value else None
        if ended:  # a multi-node job's agents outlive a killed launcher, training on
            print(f"job {meta.get('run_id')}: its launcher is gone but its node agents still "
                  f"ran its workers: ended {', '.join(ended)} (their workers end with them)"
                  + (f"; {found}" if found else ""))
            return ExitCode.SUCCESS
        if found:
            print(f"job {meta.get('run_id')}: {found}")
        if unknown:  # (review 55 #2: read as none, "the job has already ended")
            complain("stop", f"the job's launcher is gone, and of its node agents {unknown}: "
                     "nothing was ended, their workers may train on. Fix: run `trainguard stop "
                     f"{args.job_dir}` again once Slurm answers, or `scancel "
                     f"{meta.get(SLURM_JOB_KEY)}` (the whole allocation)")
            return ExitCode.FAILED
        why = "its launcher is gone" if state == JobState.LOST.value else "nothing to stop"
        complain("stop", f"the job has already ended ({state}): {why}", "note")
        return ExitCode.SUCCESS
    pid, host = meta.get("launcher_pid"), meta.get("launcher_host")
    if not isinstance(pid, int):
        complain("stop", "the store names no launcher pid (is the job still being created?); "
                 "try again")
        return ExitCode.NO_JOB
    if host != socket.gethostname():
        complain("stop", f"the launcher runs on {host} (pid {pid}), not here: run `trainguard "
                 f"stop` on {host}, or `kill -TERM {pid}` there")
        return ExitCode.USAGE
    proc = _launcher(pid)
    if proc is None:
        complain("stop", f"pid {pid} is not a trainguard launcher any more (the job's launcher "
                 "died and the pid was reused?): nothing sent")
        return ExitCode.NO_JOB
    if under_way is not None and not args.now:  # a second SIGTERM would end the grace period
        print(f"the stop of job {meta.get('run_id')} requested at "
              f"{clock_or_dash(under_way['requested_at'])} is under way: waiting for its "
              f"launcher (pid {pid}); --now ends the ranks' grace period at once", flush=True)
    else:
        what = (f"a second SIGTERM to its launcher (pid {pid}): the ranks' grace period ends "
                "now" if under_way is not None else f"SIGTERM to its launcher (pid {pid}); the "
                "workers get their grace period")
        print(f"stopping job {meta.get('run_id')}: {what}", flush=True)
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
    if _wait_gone(proc, args.timeout):
        return _stopped(Path(args.job_dir))
    if not args.force:
        grace = meta.get("grace_period_s")
        left = (f"the ranks have the grace period ({grace:g}s) to exit, then SIGKILL: "
                if isinstance(grace, (int, float)) else "")
        complain("stop", f"the stop is under way but the launcher (pid {pid}) is still running "
                 f"after {args.timeout:g}s; {left}wait longer (`trainguard stop` again waits "
                 "without signalling twice; `trainguard status`), end the grace period now "
                 "with --now, or kill the launcher with --force")
        return ExitCode.FAILED
    print(f"the launcher did not end within {args.timeout:g}s: SIGKILL (its guardian kills "
          "the workers)", flush=True)
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGKILL)
    if not _wait_gone(proc, 10.0):
        complain("stop", f"the launcher (pid {pid}) is still there 10s after SIGKILL")
        return ExitCode.FAILED
    ended, unknown = _end_agents(Path(args.job_dir))
    if ended:  # a multi-node job's agents outlive their launcher (for a takeover)
        print(f"ended its node agents {', '.join(ended)} (their workers end with them)",
              flush=True)
    if unknown:
        complain("stop", f"of its node agents {unknown}: run `trainguard stop "
                 f"{args.job_dir}` again once Slurm answers", "note")
    return _stopped(Path(args.job_dir), killed=True)


def _end_agents(job_dir: Path) -> tuple[list[str], str | None]:
    """A multi-node job's node agents that still run, ended (each agent's guardian kills its
    workers): they outlive a killed launcher, waiting for a controller to take the job over,
    and train on meanwhile. The local backend's by SIGKILL to their process groups, Slurm's
    by scancel of their steps (backends.orphans); what was ended, each named, and why
    Slurm could not say which run (None: it answered)."""
    try:
        with JobStore.open(job_dir) as store:
            meta, rows = store.meta(), store.nodes()
    except StoreError:
        return [], None
    return end_agents(meta, rows)


def _launcher(pid: int) -> psutil.Process | None:
    """The process `pid` if it is a trainguard launcher (`trainguard run` or `python -m
    trainguard run`), else None: a stale pid is never signalled."""
    try:
        proc = psutil.Process(pid)
        cmd = proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None
    text = " ".join(cmd)
    return proc if "trainguard" in text and " run" in f" {text}" else None


def _wait_gone(proc: psutil.Process, timeout_s: float) -> bool:
    """Whether the process ended within `timeout_s` (an exited, not yet reaped one too: it
    is not our child, its parent reaps it)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(STOP_POLL_S)


def _stopped(job_dir: Path, killed: bool = False) -> int:
    """The job's end as the store tells it: 0 when it has ended (a launcher killed with
    --force leaves it `lost`: no exit code was recorded, and the next step is said), 1 when
    it still reads running."""
    with JobStore.open(job_dir) as store:
        meta = store.meta()
    state, run_id = shown_state(meta), meta.get("run_id")
    if state == JobState.LOST.value:
        how = "was killed" if killed else "ended without recording the job's end"
        print(f"job {run_id}: lost (the launcher {how}, so there is no exit code). Continue "
              f"it: run the same `trainguard run` command with --job-dir {job_dir.resolve()} "
              "(it resumes from the newest checkpoint, or starts over if none was saved)")
        return ExitCode.SUCCESS
    if state not in JOB_ENDED:
        complain("stop", f"the launcher is gone but the job still reads {state}; see "
                 f"`trainguard status {job_dir}`")
        return ExitCode.FAILED
    print(f"job {run_id}: {state} (exit code {dash(meta.get('exit_code'))})")
    return ExitCode.SUCCESS


# -- ls --------------------------------------------------------------------------------


def cmd_ls(args: argparse.Namespace) -> int:
    root = Path(args.root)
    if not root.is_dir():
        default = (" (the default: where `trainguard run` puts a job given no --job-dir, "
                   "under the directory it ran in)" if args.root == DEFAULT_RUNS_DIR else "")
        what = "is not a directory" if root.exists() else "does not exist"
        complain("ls", f"{root.resolve()} {what}{default}; pass the directory that holds the "
                 "job dirs: trainguard ls ROOT")
        return ExitCode.NO_JOB
    rows = [job_row(d) for d in find_job_dirs(root.resolve())]
    if args.json:
        print_json(rows)
        return ExitCode.SUCCESS
    if not rows:
        print(f"no trainguard jobs under {root}")
        return ExitCode.SUCCESS
    table = Table(box=None, pad_edge=False)
    for name in ("RUN ID", "STATE", "ATTEMPTS", "STEP", "LAST PROGRESS", "SIZE", "JOB DIR"):
        table.add_column(name, no_wrap=name != "JOB DIR")
    for r in rows:
        table.add_row(dash(r["run_id"]), dash(r["state"]), dash(r.get("attempts")),
                      _step(r), when(r.get("last_progress_at")),
                      size_text(r["size_bytes"]), r["job_dir"])
    print_table(table)
    return ExitCode.SUCCESS


def _step(row: dict[str, Any]) -> str:
    """The STEP cell: a job that reports no steps shows its last committed checkpoint."""
    ckpt = " (checkpoint)" if row.get("progress_source") == "checkpoint" else ""
    return dash(row.get("last_step")) + ckpt
