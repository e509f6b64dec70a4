"""The launcher's exit codes (docs/cli.md, Exit codes), and how to name an exit. Pure."""

from __future__ import annotations

import signal
from enum import IntEnum


class ExitCode(IntEnum):
    SUCCESS = 0
    FAILED = 1  # the job failed (user error, restart budget spent), as torchrun
    USAGE = 2  # bad flags, job file or job dir: nothing was started
    # Attempts kept failing without progress: a scheduler should NOT requeue this job
    # (e.g. Slurm: `scontrol requeue` only when the exit code is not this one).
    NO_PROGRESS = 86
    # Stopped by a signal: 128 + the signal number (130 for SIGINT, 143 for SIGTERM).


def signal_name(sig: int | None) -> str | None:
    """`SIGKILL` for 9; None for None."""
    if sig is None:
        return None
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def describe_exit(returncode: int | None) -> str:
    """How a process ended, from its Popen-style return code (negative: a signal)."""
    if returncode is None:
        return "is still running"
    if returncode < 0:
        return f"was killed by {signal_name(-returncode)}"
    return f"exited with code {returncode}"
