"""Where a job keeps its things: JOB_DIR/{trainguard.db, logs/, checkpoints/}."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trainguard.spec import JobSpec

DEFAULT_RUNS_DIR = "trainguard-runs"


@dataclass(frozen=True)
class JobPaths:
    job_dir: Path
    log_dir: Path
    checkpoint_dir: Path

    @classmethod
    def for_spec(cls, spec: JobSpec, cwd: Path) -> JobPaths:
        job_dir = (cwd / (spec.job_dir or f"{DEFAULT_RUNS_DIR}/{spec.run_id}")).resolve()
        log_dir = (cwd / spec.log_dir).resolve() if spec.log_dir else job_dir / "logs"
        ckpt = ((cwd / spec.checkpoint_dir).resolve() if spec.checkpoint_dir
                else job_dir / "checkpoints")
        return cls(job_dir, log_dir, ckpt)

    def make(self) -> None:
        for d in (self.job_dir, self.log_dir, self.checkpoint_dir):
            d.mkdir(parents=True, exist_ok=True)
