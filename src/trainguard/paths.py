"""Where a job keeps its things: JOB_DIR/{trainguard.db, logs/, checkpoints/}.

Under the log dir, one dir per attempt: `attempt-N/rank-R.log` (each rank's output, written
by the node agent), `attempt-N/stacks/` (the stack dumps of a confirmed hang and the
controller's verdict, `hang.json`), read back by `trainguard diagnose`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trainguard.spec import JobSpec

DEFAULT_RUNS_DIR = "trainguard-runs"
STACKS_DIR = "stacks"  # in an attempt's log dir
HANG_FILE = "hang.json"  # in its stacks dir


@dataclass(frozen=True)
class JobPaths:
    job_dir: Path
    log_dir: Path
    checkpoint_dir: str  # an absolute local path, or an fsspec URL (s3://bucket/run1) as given

    @classmethod
    def for_spec(cls, spec: JobSpec, cwd: Path) -> JobPaths:
        job_dir = (cwd / (spec.job_dir or f"{DEFAULT_RUNS_DIR}/{spec.run_id}")).resolve()
        log_dir = (cwd / spec.log_dir).resolve() if spec.log_dir else job_dir / "logs"
        ckpt = spec.checkpoint_dir
        if ckpt is None:
            ckpt = str(job_dir / "checkpoints")
        elif not is_url(ckpt):
            ckpt = str((cwd / ckpt).resolve())
        return cls(job_dir, log_dir, ckpt)

    def make(self) -> None:
        local = [] if is_url(self.checkpoint_dir) else [Path(self.checkpoint_dir)]
        for d in (self.job_dir, self.log_dir, *local):
            d.mkdir(parents=True, exist_ok=True)


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
