"""`trainguard prune ROOT`: delete the dirs of jobs that ended long enough ago, and never what
a running job uses.

A job's dir can hold what another job uses: `run --job-dir B --checkpoint-dir A/checkpoints`
continues from an ended job A, and `prune` deleted A with B's committed checkpoints while B
ran (walk-through 31). Before anything is deleted, the running jobs prune can see are read
(the stores under ROOT, the stores found inside the dirs it would delete and the job dirs
named by the owner marks (`.trainguard-job`) of log or checkpoint dirs there, and the job
dirs this user's processes on this machine work for), with where each writes (its job
dir, log dir and checkpoint dir, as its store records them); a job dir holding one of those
is kept, with a note naming the job.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psutil

from trainguard.backends.orphans import AgentsSeen
from trainguard.cli.args import days
from trainguard.cli.fmt import complain, meta_time, plural, size_text
from trainguard.cli.job_rows import read_job, when
from trainguard.controller.dir_owner import OWNER_NAME, read_owner
from trainguard.controller.store_rows import checkpoint_dir_of, log_dir_of
from trainguard.node.usage import allocated_bytes
from trainguard.paths import DB_NAME, DEFAULT_RUNS_DIR, is_url, prune_plan
from trainguard.records import utcnow
from trainguard.states import JOB_ENDED
from trainguard.ui.catalog import find_job_dirs
from trainguard.worker.contract import ENV_CHECKPOINT_DIR, ENV_JOB_DIR


def add_prune_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    pr = sub.add_parser("prune", help="delete ended jobs older than N days",
                        description="Delete the job dirs under ROOT (their store, logs and "
                        "checkpoints) of jobs that ended (or whose launcher is gone) more than "
                        "--older-than days ago. Lists them only, unless --yes. A job that "
                        "runs is never touched, nor a job dir that holds what a running job "
                        "uses (its job dir, --log-dir or --checkpoint-dir), nor anything in a "
                        "job dir that trainguard did not write there, nor a --log-dir or "
                        "--checkpoint-dir outside it.")
    pr.add_argument("root", metavar="ROOT", nargs="?", default=DEFAULT_RUNS_DIR,
                    help=f"where to look, two levels deep (default: ./{DEFAULT_RUNS_DIR}, as "
                    "for ls)")
    pr.add_argument("--older-than", type=days, required=True, metavar="DAYS",
                    help="ended at least this many days ago (0 or more)")
    pr.add_argument("--yes", action="store_true", help="delete them (default: list only)")
    pr.set_defaults(func=cmd_prune)


@dataclass(frozen=True)
class Use:
    """A dir a job that is not due uses (one that runs, or ended since the cutoff): `what` is
    "job dir", "log dir" or "checkpoint dir"."""

    job_dir: Path
    run_id: str | None
    what: str
    path: Path
    pid: int | None = None  # found through this process (a worker of the job)
    ended: str | None = None  # the job ended (at this time), but not before the cutoff

    def said(self) -> str:
        job = f"job {self.run_id or '?'} ({self.job_dir})"
        if self.pid is not None:
            who = f"process {self.pid}, a worker of {job}, still runs and"
        elif self.ended is not None:
            who = f"the {job}, which ended {self.ended} (not long enough ago),"
        else:
            who = f"the running {job}"
        return f"{who} uses {self.path} (its {self.what})"

    def fix(self, days: float) -> str:
        """What to do about the job dir this use keeps."""
        if self.ended is not None:
            return (f"prune it once that job too ended more than {days:g} "
                    f"{'day' if days == 1 else 'days'} ago")
        return f"prune it once that job has ended (`trainguard status {self.job_dir}`)"


def cmd_prune(args: argparse.Namespace) -> int:
    from trainguard.exitcodes import ExitCode

    root = Path(args.root)
    if not root.is_dir():
        complain("prune", f"{root} is not a directory. Fix: pass the directory that holds the "
                 "job dirs (as for trainguard ls)")
        return ExitCode.NO_JOB
    cutoff = utcnow() - timedelta(days=args.older_than)
    jobs = [read_job(d) for d in find_job_dirs(root.resolve())]
    due = [(r, meta) for r, meta in jobs if _prunable(r, cutoff)]
    for r in (r for r, _ in due if r["agents_without_controller"]):
        complain("prune", f"{r['job_dir']} is lost, but the node agents of "
                 f"{', '.join(r['agents_without_controller'])} still run and their workers "
                 f"train on: not deleted. Fix: `trainguard stop {r['job_dir']}` ends them "
                 "(or run the job's command again to take it over)", "note")
    for r in (r for r, _ in due if r.get("agents_unknown")):  # (review 53 #6: read as none)
        complain("prune", f"{r['job_dir']} is lost, and of its node agents "
                 f"{r['agents_unknown']}: not deleted (their workers may train on). Fix: "
                 "run prune again once Slurm answers", "note")
    due = [(r, meta) for r, meta in due if not _agents_may_run(r)]
    plans = [(r, meta, *_plan(Path(r["job_dir"]), meta)) for r, meta in due]
    uses = running_uses([(r, meta) for r, meta in jobs if _not_due(r, cutoff)],
                        [(Path(r["job_dir"]), delete) for r, _, _, delete, _ in plans],
                        cutoff) if due else []
    old = kept = 0
    freed = 0
    for r, _, own, delete, keep in plans:
        job_dir = Path(r["job_dir"])
        use = blocking(job_dir, delete, uses)
        if use is not None:
            complain("prune", f"{job_dir} is not deleted: {use.said()}, inside it. Fix: "
                     f"{use.fix(args.older_than)}; what that job keeps there goes with it "
                     "then", "note")
            kept += 1
            continue
        old += 1
        size = sum(allocated_bytes(p)[0] for p in delete)
        freed += size
        what = f"trainguard's files in {job_dir}" if keep else str(job_dir)
        print(f"{'deleting' if args.yes else 'would delete'} {what} ({r['state']}, "
              f"ended {when(r.get('ended_at') or r.get('last_progress_at'))}, "
              f"{size_text(size)})")
        if keep:  # the job ran in a dir that was not its own (--job-dir .)
            shown = ", ".join(keep[:5]) + (f" and {len(keep) - 5} more" if len(keep) > 5 else "")
            print(f"  {'keeping' if args.yes else 'would keep'} what trainguard did not write "
                  f"there: {shown}")
        if args.yes:
            _delete(job_dir, delete, own)
    print(prune_summary(old, args.older_than, size_text(freed), deleted=args.yes, kept=kept))
    return ExitCode.SUCCESS


def _plan(job_dir: Path, meta: dict[str, Any]
          ) -> tuple[list[Path], list[Path], list[str]]:
    """The job's own log and checkpoint dirs, what prune deletes of it and what it keeps."""
    own = [log_dir_of(meta, job_dir), Path(checkpoint_dir_of(meta, job_dir))]
    delete, keep = prune_plan(job_dir, own[0], str(own[1]))
    return own, delete, keep


def _in_use(r: dict[str, Any]) -> bool:
    """A job that runs (or whose store cannot be read: it may be one being made), or a lost
    one whose node agents still run its workers (or may: Slurm could not be asked)."""
    return r["state"] not in JOB_ENDED or _agents_may_run(r)


def _agents_may_run(r: dict[str, Any]) -> bool:
    """AgentsSeen.may_run of the row's agents (cli/job_rows.py writes them from it)."""
    return AgentsSeen(list(r.get("agents_without_controller") or []),
                      r.get("agents_unknown")).may_run


def _not_due(r: dict[str, Any], cutoff: datetime) -> bool:
    """A job whose dirs prune must not delete: one in use, or one that ended after `cutoff`
    (walk-through 31 review #1: B, continuing from ended A's checkpoints, failed a minute
    ago; deleting A deleted every checkpoint B wrote)."""
    return _in_use(r) or not _prunable(r, cutoff)


def running_uses(running: Iterable[tuple[dict[str, Any], dict[str, Any]]],
                 candidates: Iterable[tuple[Path, list[Path]]], cutoff: datetime) -> list[Use]:
    """The dirs jobs that are not due use (running, or ended after `cutoff`): those under
    ROOT (`running`, read already), those whose store or log dir lies inside a dir prune
    would delete (`candidates`: each due job dir and what prune deletes of it), and those
    this user's processes here work for (a job dir anywhere)."""
    workers = _workers()
    rows = {Path(r["job_dir"]).resolve(): (r, meta) for r, meta in running}
    for d in _inside(candidates) + [jd for jd, _, _ in workers]:
        if d.resolve() not in rows and (d / DB_NAME).is_file():
            rows[d.resolve()] = read_job(d)
    uses: list[Use] = []
    for r, meta in rows.values():
        if not _not_due(r, cutoff):
            continue
        jd = Path(r["job_dir"])
        ended = None if _in_use(r) else when(r.get("ended_at") or r.get("last_progress_at")
                                             or r.get("created_at"))
        uses.append(Use(jd, r.get("run_id"), "job dir", jd, ended=ended))
        if meta:
            uses.append(Use(jd, r.get("run_id"), "log dir", log_dir_of(meta, jd), ended=ended))
            kept_at = checkpoint_dir_of(meta, jd)
            if not is_url(kept_at):
                uses.append(Use(jd, r.get("run_id"), "checkpoint dir", Path(kept_at),
                                ended=ended))
    for jd, ck, pid in workers:  # a live worker: in use whatever its store says
        run_id = rows[jd.resolve()][0].get("run_id") if jd.resolve() in rows else None
        uses.append(Use(jd, run_id, "job dir", jd, pid))
        if ck is not None:
            uses.append(Use(jd, run_id, "checkpoint dir", ck, pid))
    return uses


def blocking(job_dir: Path, delete: Iterable[Path], uses: Iterable[Use]) -> Use | None:
    """The first use that deleting `delete` (paths inside `job_dir`) would touch: a dir a
    running job uses that is `job_dir` or lies inside it, and is, holds or lies inside a
    path deleted. A use around the job dir (a checkpoint dir that is ROOT) is not one: its
    job writes its own entries there, not this job's dir."""
    top = _real(job_dir)
    gone = [_real(p) for p in delete]
    for use in uses:
        at = _real(use.path)
        if at.is_relative_to(top) and any(at.is_relative_to(p) or p.is_relative_to(at)
                                          for p in gone):
            return use
    return None


def _real(p: Path) -> Path:
    """`p` with its parents' symlinks resolved, not its own (prune unlinks a symlink)."""
    p = Path(os.path.abspath(p))
    return p.parent.resolve() / p.name if p.parent != p else p


def _inside(plans: Iterable[tuple[Path, list[Path]]]) -> list[Path]:
    """Job dirs whose store, or whose log or checkpoint dir (its owner mark names the job
    dir), lies inside a dir prune would delete (`plans`: a job dir and what it deletes
    there). Only those dirs are walked, not what a job dir keeps (a project's own files,
    `--job-dir .`: review of walk-through 31 #5); the job's own marks name itself."""
    found: list[Path] = []
    for job_dir, delete in plans:
        for top in (p for p in delete
                    if not _SKIP.match(p.name) and p.is_dir() and not p.is_symlink()):
            for here, subdirs, files in os.walk(top):
                subdirs[:] = [s for s in subdirs if not _SKIP.match(s)
                              and not (Path(here) / s).is_symlink()]
                if DB_NAME in files:  # below the job dir's top: another job's store
                    found.append(Path(here))
                if OWNER_NAME in files:
                    owner = read_owner(here)
                    if owner is not None and \
                            Path(owner["job_dir"]).resolve() != job_dir.resolve():
                        found.append(Path(owner["job_dir"]))
    return found


_SKIP = re.compile(r"step-\d+$|\.tmp-step-|\.old-step-|attempt-\d+$")  # hold no job


def _workers() -> list[tuple[Path, Path | None, int]]:
    """(job dir, local checkpoint dir or None, pid) of each process of this user on this
    machine that a trainguard job started (its environment names the job dir)."""
    found: list[tuple[Path, Path | None, int]] = []
    me = os.getuid()
    for proc in psutil.process_iter(["pid", "uids"]):
        with contextlib.suppress(psutil.Error, OSError):
            if proc.info["uids"] is None or proc.info["uids"].real != me:
                continue
            env = proc.environ()
            jd = env.get(ENV_JOB_DIR)
            if not jd:
                continue
            cwd = proc.cwd()
            ck = env.get(ENV_CHECKPOINT_DIR)
            found.append((Path(cwd, jd), None if not ck or is_url(ck) else Path(cwd, ck),
                          proc.pid))
    return found


def _delete(job_dir: Path, delete: list[Path], own: list[Path]) -> None:
    """Delete `delete`, then the dirs left empty up to and with the job dir, `own` (the
    job's log and checkpoint dirs: an empty `checkpoints/` was left in a shared job dir,
    walk-through 30) among them (never a non-empty one: what trainguard did not write
    stays)."""
    for p in delete:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
    for d in sorted({p.parent for p in delete} | set(own), key=lambda d: len(d.parts),
                    reverse=True):
        while d != job_dir.parent and d.is_relative_to(job_dir):
            try:
                d.rmdir()
            except OSError:  # not empty: it stays, and so do the dirs above it
                break
            d = d.parent


def prune_summary(jobs: int, days: float, freed: str, *, deleted: bool, kept: int = 0) -> str:
    """`prune`'s last line: what ended more than `days` ago, and what was (or would be)
    freed; `kept`: how many more ended then that a job not due uses (a note names each)."""
    ago = f"ended more than {days:g} {'day' if days == 1 else 'days'} ago"
    held = (f"a job that runs or ended since uses what {'it holds' if kept == 1 else 'they hold'}"
            " (see the note above)")
    if jobs == 0:
        return (f"nothing to delete: {plural(kept, 'job')} {ago}, kept: {held}" if kept
                else f"no job {ago}: nothing to delete")
    also = f"; {plural(kept, 'more job')} kept: {held}" if kept else ""
    them = "it" if jobs == 1 else "them"
    if deleted:
        return f"deleted {plural(jobs, 'job')} that {ago}: {freed} freed{also}"
    return f"{plural(jobs, 'job')} {ago}: {freed} to free; add --yes to delete {them}{also}"


def _prunable(r: dict[str, Any], cutoff: datetime) -> bool:
    """Ended (or lost) before `cutoff`; an unreadable store or a running job never is."""
    if r["state"] not in JOB_ENDED:
        return False
    ended = meta_time(r.get("ended_at")) or meta_time(r.get("last_progress_at")) or \
        meta_time(r.get("created_at"))
    return ended is not None and ended <= cutoff
