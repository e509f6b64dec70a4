"""Every exit code trainguard's processes end with (docs/cli.md, Exit codes; the agent's in
docs/multi-node.md), and how to name an exit. Pure."""

from __future__ import annotations

import signal
from enum import IntEnum


class ExitCode(IntEnum):
    """The numbers are an interface (schedulers, scripts and tests read them): never change
    one. Where another command gives a number its own meaning, it has its own name here, an
    alias of the same member (NOTHING_FOUND is FAILED, NO_JOB is USAGE...)."""

    # -- the launcher (`trainguard run`) --
    SUCCESS = 0  # every worker exited 0; for the other commands: done
    FAILED = 1  # the job failed (user error, restart budget spent), as torchrun
    USAGE = 2  # bad flags, job file or job dir: nothing was started
    # Attempts kept failing without progress: a scheduler should NOT requeue this job
    # (e.g. Slurm: `scontrol requeue` only when the exit code is not this one).
    NO_PROGRESS = 86
    # Stopped by a signal: 128 + the signal number (130 for SIGINT, 143 for SIGTERM).
    # -- a node agent (`python -m trainguard.node.main`; USAGE: its config is unreadable) --
    ORPHANED = 3  # no controller for its orphan timeout: it stopped its workers and ended
    SUPERSEDED = 4  # a newer agent serves its node (told at the handshake): it ended
    # -- the read commands (`events`, `recovery`, `status`) --
    NO_JOB = 2  # no readable job store at JOB_DIR
    INTERRUPTED = 130  # `events --follow` ended by Ctrl-C (128 + SIGINT)
    JOB_LOST = 3  # `events --follow`, `logs -f`: the job's launcher died while followed
    # -- every command that prints --
    OUTPUT_CLOSED = 1  # the reader of stdout went away (`| head`): end quietly, as rich does
    # -- `trainguard diagnose` --
    NOTHING_FOUND = 1  # no failure found in the logs
    # -- `trainguard ckpt ls|verify` --
    NOT_VALID = 1  # verify: no checkpoint, or the newest one is not valid
    UNREADABLE = 2  # the location cannot be read (path, URL, credentials)


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
