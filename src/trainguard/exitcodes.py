"""The launcher's exit codes (docs/exit-codes.md)."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    SUCCESS = 0
    FAILED = 1  # the job failed (user error, restart budget spent), as torchrun
    USAGE = 2  # bad flags, job file or job dir: nothing was started
    # Attempts kept failing without progress: a scheduler should NOT requeue this job
    # (e.g. Slurm: `scontrol requeue` only when the exit code is not this one).
    NO_PROGRESS = 86
    # Stopped by a signal: 128 + the signal number (130 for SIGINT, 143 for SIGTERM).
