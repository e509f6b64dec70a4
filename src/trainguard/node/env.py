"""The environment a worker starts with: torchrun's variables plus trainguard's own."""

from __future__ import annotations

import os
import sys

from trainguard.protocol import StartWorkers, WorkerAssignment


def worker_env(cmd: StartWorkers, a: WorkerAssignment, error_file: str,
               marker: str) -> dict[str, str]:
    """torchrun's worker environment, plus trainguard's own variables."""
    env = dict(os.environ)
    env.update(cmd.env)
    local_world = len(cmd.workers)
    env.update({
        "RANK": str(a.rank), "LOCAL_RANK": str(a.local_rank),
        "WORLD_SIZE": str(cmd.world_size), "LOCAL_WORLD_SIZE": str(local_world),
        "GROUP_RANK": str(cmd.group_rank), "GROUP_WORLD_SIZE": str(cmd.group_world_size),
        "ROLE_RANK": str(a.rank), "ROLE_WORLD_SIZE": str(cmd.world_size),
        "ROLE_NAME": "default",
        "MASTER_ADDR": cmd.master_addr, "MASTER_PORT": str(cmd.master_port),
        "TORCHELASTIC_RESTART_COUNT": str(cmd.attempt),
        "TORCHELASTIC_MAX_RESTARTS": str(cmd.max_restarts),
        "TORCHELASTIC_RUN_ID": cmd.run_id,
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCHELASTIC_ERROR_FILE": error_file,
        "PYTHON_EXEC": sys.executable,
        "TRAINGUARD_PROCESS_START_COUNT": str(a.start_count),
        "TRAINGUARD_SCHEDULE_COUNT": str(a.schedule_count),
        "TRAINGUARD_ATTEMPT": str(cmd.attempt),
        "TRAINGUARD_JOB_DIR": cmd.job_dir,
        "TRAINGUARD_CHECKPOINT_DIR": cmd.checkpoint_dir,
        "TRAINGUARD_MARKER": marker,
    })
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env
