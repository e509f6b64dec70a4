"""Where a job keeps its things: JOB_DIR/{trainguard.db, logs/, checkpoints/}.

Under the log dir, one dir per attempt: `attempt-N/rank-R.log` (each rank's output, written
by the node agent), `attempt-N/stacks/` (the stack dumps of a confirmed hang and the
controller's verdict, `hang.json`), read back by `trainguard diagnose`.
"""

from __future__ import annotations

import errno
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from trainguard.errors import SpecError
from trainguard.spec import JobSpec, flag_name

DEFAULT_RUNS_DIR = "trainguard-runs"
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
    elif not os.access(parent, os.W_OK | os.X_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(below))
    else:  # root may "write" where no dir can be made (/proc): try, and leave nothing
        try:
            os.rmdir(tempfile.mkdtemp(prefix=".trainguard-probe-", dir=parent))
        except OSError as e:
            raise OSError(e.errno, e.strerror, str(below)) from None


def is_url(location: str | Path) -> bool:
    """`s3://bucket/x`, `file:///x`: an fsspec URL, not a local path."""
    return "://" in str(location)


def attempt_log_dir(log_dir: Path, attempt: int) -> Path:
    return log_dir / f"attempt-{attempt}"


def rank_log_path(log_dir: Path, attempt: int, rank: int) -> Path:
    return attempt_log_dir(log_dir, attempt) / f"rank-{rank}.log"


def stacks_dir(log_dir: Path, attempt: int) -> Path:
    """Where a confirmed hang's stack dumps and verdict (HANG_FILE) go."""
    return attempt_log_dir(log_dir, attempt) / STACKS_DIR
