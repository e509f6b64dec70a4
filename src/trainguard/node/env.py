"""The environment a worker starts with: torchrun's variables plus trainguard's own."""

from __future__ import annotations

import os
import sys

from trainguard.protocol import StartWorkers, WorkerAssignment
from trainguard.worker import contract as c


def worker_env(cmd: StartWorkers, a: WorkerAssignment, error_file: str,
               marker: str) -> dict[str, str]:
    """torchrun's worker environment, plus trainguard's own variables."""
    env = dict(os.environ)
    env.update(cmd.env)
    local_world = len(cmd.workers)
    env.update({
        c.ENV_RANK: str(a.rank), c.ENV_LOCAL_RANK: str(a.local_rank),
        c.ENV_WORLD_SIZE: str(cmd.world_size), c.ENV_LOCAL_WORLD_SIZE: str(local_world),
        c.ENV_GROUP_RANK: str(cmd.group_rank),
        c.ENV_GROUP_WORLD_SIZE: str(cmd.group_world_size),
        c.ENV_ROLE_RANK: str(a.rank), c.ENV_ROLE_WORLD_SIZE: str(cmd.world_size),
        c.ENV_ROLE_NAME: "default",
        c.ENV_MASTER_ADDR: cmd.master_addr, c.ENV_MASTER_PORT: str(cmd.master_port),
        c.ENV_RESTART_COUNT: str(cmd.attempt),
        c.ENV_MAX_RESTARTS: str(cmd.max_restarts),
        c.ENV_RUN_ID: cmd.run_id,
        c.ENV_USE_AGENT_STORE: "False",
        c.ENV_ERROR_FILE: error_file,
        c.ENV_PYTHON_EXEC: sys.executable,
        c.ENV_PROCESS_START_COUNT: str(a.start_count),
        c.ENV_SCHEDULE_COUNT: str(a.schedule_count),
        c.ENV_ATTEMPT: str(cmd.attempt),
        c.ENV_JOB_DIR: cmd.job_dir,
        c.ENV_CHECKPOINT_DIR: cmd.checkpoint_dir,
        c.ENV_MARKER: marker,
    })
    env.setdefault(c.ENV_OMP_NUM_THREADS, "1")
    env.setdefault(c.ENV_PYTHONUNBUFFERED, "1")
    env.setdefault(c.ENV_PYTHONFAULTHANDLER, "1")
    return env

