"""Where a job keeps its things: JOB_DIR/{trainguard.db, logs/, checkpoints/}.

Under the log dir, one dir per attempt: `attempt-N/rank-R.log` (each rank's output, written
by the node agent), `attempt-N/stacks/` (the stack dumps of a confirmed hang and the
controller's verdict, `hang.json`), read back by `trainguard diagnose`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from trainguard.checkpoint.manifest import OWNER_NAME
from trainguard.errors import SpecError
from trainguard.spec import JobSpec, flag_name

DEFAULT_RUNS_DIR = "trainguard-runs"
DB_NAME = "trainguard.db"  # the job's store (controller/store.py)
LOCK_NAME = ".lock"  # held by the job's launcher (launch_checks.job_lock)
# the files trainguard writes at a job dir's top (the store and SQLite's side files, the
# launcher's lock, a multi-node job's cluster/ dir), besides its log and checkpoint dirs
RESERVE_NAME = ".trainguard-reserve"  # room for the job's end (controller/reserve.py)
JOB_DIR_FILES = frozenset({DB_NAME, f"{DB_NAME}-wal", f"{DB_NAME}-shm", f"{DB_NAME}-journal",
                           LOCK_NAME, RESERVE_NAME, OWNER_NAME, "cluster"})
# what trainguard writes in a log dir (one dir per attempt) and in a checkpoint dir (a dir
# per step, the `latest` pointer, and the staging names a save leaves if it is killed)
_LOG_DIR_OWN = re.compile(r"attempt-\d+$|\.trainguard-job$")
_CHECKPOINT_DIR_OWN = re.compile(r"step-\d{9,}$|latest$|\.tmp-step-|\.old-step-|\.latest\..*\.tmp$"
                                 r"|\.trainguard-job$")  # the dir's owner (walk-through 31 #3)
_PROBE = ".trainguard-probe-"  # _check_makeable's, removed at once
STACKS_DIR = "stacks"  # in an attempt's log dir
HANG_FILE = "hang.json"  # in its stacks dir


@dataclass(frozen=True)
class JobPaths:
    job_dir: Path
    log_dir: Path
    checkpoint_dir: str  # an absolute local path, or an fsspec URL (s3://bucket/run1) as given
    # the setting that gave the log and checkpoint dirs: their own, or job_dir (the default)
    log_dir_key: str = "job_dir"
    checkpoint_dir_key: str = "job_dir"

    @classmethod
    def for_spec(cls, spec: JobSpec, cwd: Path) -> JobPaths:
        job_dir = (cwd / (spec.job_dir or f"{DEFAULT_RUNS_DIR}/{spec.run_id}")).resolve()
        log_dir = (cwd / spec.log_dir).resolve() if spec.log_dir else job_dir / "logs"
        ckpt = spec.checkpoint_dir
        if ckpt is None:
            ckpt = str(job_dir / "checkpoints")
        elif not is_url(ckpt):
            ckpt = str((cwd / ckpt).resolve())
        return cls(job_dir, log_dir, ckpt, "log_dir" if spec.log_dir else "job_dir",
                   "job_dir" if spec.checkpoint_dir is None else "checkpoint_dir")

    def make(self, create: bool = True) -> None:
        """Make the job, log and (local) checkpoint dirs; with `create=False` (`run
        --dry-run`) only check that they could be made. A SpecError names the flag and
        job-file key that gave the path that cannot be a directory."""
        dirs = [("job_dir", self.job_dir), (self.log_dir_key, self.log_dir)]
        if not is_url(self.checkpoint_dir):
            dirs.append((self.checkpoint_dir_key, Path(self.checkpoint_dir)))
        for make in (_check_makeable, _mkdir) if create else (_check_makeable,):
            for key, d in dirs:  # all checked before any is made: none is made in vain
                try:
                    make(d)
                except FileExistsError as e:  # a file (or a link to one) is in the way
                    raise SpecError(f"{flag_name(key)} / '{key}'", f"{e.filename or d} is a "
                                    "file, not a directory", "give a directory (a new "
                                    "name is made), or move the file away") from None
                except OSError as e:
                    raise SpecError(f"{flag_name(key)} / '{key}'", f"cannot create "
                                    f"{e.filename or d} ({e.strerror})",
                                    "choose a writable directory") from None


def _mkdir(d: Path) -> None:
    d.mkdir(parents=True, exist_ok=True)


def _check_makeable(d: Path) -> None:
    """Raise the OSError `d.mkdir(parents=True, exist_ok=True)` would, making nothing (a
    probe dir made in the nearest existing ancestor is removed at once)."""
    below, parent = d, d
    while not (parent.exists() or parent.is_symlink()) and parent != parent.parent:
        below, parent = parent, parent.parent
    if parent == d:
        if not d.is_dir():
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(d))
    elif not parent.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(d))
    elif not os.access(parent, os.W_OK | os.X_OK):  # a read-only mount says so (EROFS)
        code = errno.EROFS if os.statvfs(parent).f_flag & os.ST_RDONLY else errno.EACCES
        raise OSError(code, os.strerror(code), str(below))
    else:  # root may "write" where no dir can be made (/proc): try, and leave nothing
        try:
            os.rmdir(tempfile.mkdtemp(prefix=".trainguard-probe-", dir=parent))
        except OSError as e:
            raise OSError(e.errno, e.strerror, str(below)) from None


def foreign_entries(job_dir: Path) -> list[str]:
    """What a dir that holds no job yet already holds, but empty dirs and trainguard's own
    files (sorted names; a dir with a trailing `/`): [] when it is not a directory."""
    try:
        names = sorted(os.listdir(job_dir))
    except OSError:
        return []
    out = []
    for n in names:
        p = job_dir / n
        if n in JOB_DIR_FILES or n.startswith(_PROBE):
            continue
        if p.is_dir() and not p.is_symlink():
            with contextlib.suppress(OSError):
                if any(os.scandir(p)):
                    out.append(f"{n}/")
        else:
            out.append(n)
    return out


def prune_plan(job_dir: Path, log_dir: Path, checkpoint_dir: str) -> tuple[list[Path], list[str]]:
    """What `prune` deletes of an ended job, and what it keeps (names relative to the job
    dir), given where the job kept its logs and checkpoints. A job dir of the job's own goes
    whole: trainguard's files and the log and checkpoint dirs inside it. A dir that also
    holds other things (`--job-dir .` in a project) keeps them: only trainguard's files, the
    log dir's `attempt-N` dirs and the checkpoint dir's step dirs and `latest` go."""
    job_dir = job_dir.resolve()
    dirs: list[tuple[Path, re.Pattern[str]]] = []
    for d, own in ((log_dir, _LOG_DIR_OWN),
                   (None if is_url(checkpoint_dir) else Path(checkpoint_dir), _CHECKPOINT_DIR_OWN)):
        if d is not None and (d := d.resolve()) != job_dir and d.is_relative_to(job_dir):
            dirs.append((d, own))
    tops = {d.relative_to(job_dir).parts[0] for d, _ in dirs}
    try:
        names = sorted(os.listdir(job_dir))
    except OSError:
        return [], []
    others = [n for n in names
              if n not in JOB_DIR_FILES and n not in tops and not n.startswith(_PROBE)]
    if not others:
        return [job_dir / n for n in names if n in JOB_DIR_FILES or n in tops], []
    delete = [job_dir / n for n in names if n in JOB_DIR_FILES]
    keep = list(others)
    for d, own in dirs:
        with contextlib.suppress(OSError):
            for n in sorted(os.listdir(d)):
                if own.match(n):
                    delete.append(d / n)
                else:
                    keep.append(str((d / n).relative_to(job_dir)))
    return delete, keep


def is_url(location: str | Path) -> bool:
    """`s3://bucket/x`, `file:///x`: an fsspec URL, not a local path."""
    return "://" in str(location)


def attempt_logs(log_dir: Path) -> list[str]:
    """The `attempt-N` dirs a log dir holds (sorted names; [] when it holds none or cannot
    be read)."""
    try:
        return sorted(n for n in os.listdir(log_dir) if _LOG_DIR_OWN.match(n)
                      and n != OWNER_NAME)
    except OSError:
        return []


def attempt_log_dir(log_dir: Path, attempt: int) -> Path:
    return log_dir / f"attempt-{attempt}"


def rank_log_path(log_dir: Path, attempt: int, rank: int) -> Path:
    return attempt_log_dir(log_dir, attempt) / f"rank-{rank}.log"


def stacks_dir(log_dir: Path, attempt: int) -> Path:
    """Where a confirmed hang's stack dumps and verdict (HANG_FILE) go."""
    return attempt_log_dir(log_dir, attempt) / STACKS_DIR
