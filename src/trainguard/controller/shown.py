"""The job as the read commands show it (`status`, `ls`, `stop`, the dashboard, the metrics):
its state (`lost` when its launcher is dead), its last progress and sign of life, a confirmed
hang left running, a stop under way. Pure but for looking at the launcher's process
(/proc/PID/stat): one rule for every reader."""

from __future__ import annotations

import json
import os
import socket
import time
from datetime import datetime, timezone
from typing import Any

from trainguard.records import Event, Reason, RunningRecord, from_iso, iso
from trainguard.states import JobState

# the events that say whether a confirmed hang is left running: cleared by progress, or
# acted on inside the attempt (an in-process restart goes on in the same attempt; walk-
# through 27: status read HUNG while the restarted job trained on)
HANG_REASONS = (Reason.HANG_CONFIRMED.value, Reason.HANG_CLEARED.value,
                Reason.IN_PROCESS_RESTARTING.value)


def shown_state(meta: dict[str, Any]) -> str | None:
    """The job's state as the read commands show it: the recorded one, or `lost` when the
    store says the job is active but its launcher is dead (killed with SIGKILL, or its
    machine rebooted: nothing could record the end). A state this version does not know
    is shown as recorded; None when none is."""
    state = meta.get("state")
    try:
        recorded = JobState(state)
    except ValueError:
        return state if isinstance(state, str) else None
    if recorded.active and launcher_dead(meta):
        return JobState.LOST.value
    return recorded.value


def last_progress(meta: dict[str, Any], checkpoint: tuple[int, str] | None
                  ) -> dict[str, Any]:
    """The job's last progress: the last step its workers reported (`source` "step"), or
    its last committed checkpoint (`source` "checkpoint") for a job that reports no steps
    (`--quiet`, a script that only saves checkpoints) and when the checkpoint is further
    (steps trained while no controller watched: a multi-node job's agents hand their
    commits to the next controller, not their steps; walk-through 26); all None before
    either."""
    step, at = meta.get("last_step"), meta.get("last_progress_at")
    if checkpoint is not None and (not isinstance(step, int) or checkpoint[0] > step):
        return {"step": checkpoint[0], "time": checkpoint[1], "source": "checkpoint"}
    return {"step": step, "time": at, "source": None if step is None else "step"}


def last_sign_of_life(meta: dict[str, Any], records: list[RunningRecord],
                      last_sample: float | None, last_event: float | None) -> float | None:
    """When a launch whose launcher died (`lost`: nothing recorded its end) was last known
    to be alive, epoch seconds: the newest of its attempts' starts, ends and first output,
    the last progress sample, the last event and the last progress in meta; None if none."""
    times = [t for r in records for t in (r.start_at, r.end_at, r.first_output_at) if t]
    signs = [t.timestamp() for t in times]
    signs += [t for t in (last_sample, last_event) if t is not None]
    last = meta.get("last_progress_at")
    progress = from_iso(last) if isinstance(last, str) else None
    signs += [progress.timestamp()] if progress is not None else []
    return max(signs, default=None)


def slot_moves(meta: dict[str, Any]) -> dict[int, int]:
    """How often each slot's ranks moved to another node in the launches recorded (meta
    `slot_moves`, the fleet's): a rank's schedule count keeps growing across launches."""
    try:
        moves = json.loads(meta.get("slot_moves") or "{}")
        return {int(k): int(v) for k, v in moves.items()}
    except (TypeError, ValueError, AttributeError):
        return {}


def hang_left_running(state: str | None, attempt: Any, events: list[Event]
                      ) -> dict[str, Any] | None:
    """A hang confirmed in the current attempt and not cleared, while the job is active
    (`events`: the job's HANG_REASONS events): what `status`, the dashboard and the metrics
    show of it; None when there is none."""
    if state not in {s.value for s in JobState if s.active}:
        return None
    last = [ev for ev in events if ev.involved.attempt == attempt][-1:]
    if not last or last[0].reason != Reason.HANG_CONFIRMED.value:
        return None
    data = last[0].data or {}
    culprit = data.get("culprit") if isinstance(data.get("culprit"), dict) else {}
    at = data.get("confirmed_at")  # when it was confirmed, before the stacks were taken
    return {"confirmed_at": at if isinstance(at, str) else iso(last[0].time),
            "ranks": data.get("stuck_ranks"),
            "culprit": (culprit or {}).get("reason") or "none named"}


def launcher_dead(meta: dict[str, Any]) -> bool:
    """Whether the launcher recorded in meta is known to be gone: it ran on this host and
    its pid is no longer there, or is a zombie, or is another process's now (its start time
    is not the one recorded, `launcher_started`: pids wrap within an hour on a busy machine,
    and a job killed last night read `restarting` for ever; walk-through 30). On another
    host nobody here can tell: False."""
    pid, host = meta.get("launcher_pid"), meta.get("launcher_host")
    if not isinstance(pid, int) or host != socket.gethostname():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    fields = _stat(pid)
    if fields is None:
        return False
    started = meta.get("launcher_started")
    if fields[:1] == [b"Z"]:  # exited, not reaped by its parent yet
        return True
    return isinstance(started, int) and fields[19:20] != [str(started).encode()]


def launched_at() -> datetime:
    """When this process (the launcher) started: a job's wall time runs from the command,
    not from its store's creation (imports, checks and the job dir took 0.7-5.7 s that no
    cause of the goodput ledger held: walk-through 30). Now, where it cannot be read."""
    now = time.time()
    started = process_started(os.getpid())
    try:  # uptime to 10 ms (psutil's create_time rests on a boot time in whole seconds)
        with open("/proc/uptime", encoding="ascii") as f:
            ago = float(f.read().split()[0]) - (started or 0) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        ago = -1.0
    return datetime.fromtimestamp(now - ago if started is not None and 0 <= ago < 3600
                                  else now, timezone.utc)


def process_started(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot, /proc's `starttime`): with its
    pid it names one process for good. None where it cannot be read."""
    fields = _stat(pid)
    try:
        return None if fields is None else int(fields[19])
    except (IndexError, ValueError):
        return None


def _stat(pid: int) -> list[bytes] | None:
    """The fields of /proc/PID/stat after the command name (state first), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None

# a stop under way: the newest of these is a StopRequested of this launch
LAUNCH_REASONS = (Reason.JOB_CREATED.value, Reason.JOB_RELAUNCHED.value,
                  Reason.STOP_REQUESTED.value)


def stop_under_way(state: str | None, last_launch: Event | None) -> dict[str, Any] | None:
    """The stop requested in this launch while the job is still active (its grace period):
    `last_launch`, the newest of the job's LAUNCH_REASONS events, is a StopRequested; `state`
    as shown (shown_state: none of a job that reads ended, as one lost in its stop; review
    45 #4). `status`'s STOPPING, the dashboard's badge, and `stop`, which does not signal it
    again; None when there is none."""
    if state not in {s.value for s in JobState if s.active} or last_launch is None or \
            last_launch.reason != Reason.STOP_REQUESTED.value:
        return None
    data = last_launch.data or {}
    return {"requested_at": iso(last_launch.time), "signal": data.get("signal"),
            "grace_s": data.get("grace_s")}
