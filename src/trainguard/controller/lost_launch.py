"""How a lost launch ended (its launcher died with SIGKILL, or its machine rebooted: nothing
recorded its end), as the relaunch reads it: its last sign of life, and its last step, from
the store and from its rank logs (they outlive the launcher). Progress reaches the store in
batches, so the steps of a dead launcher's last second or so were in the logs only
(walk-through 40 #3: a record ending at a `step 230` line said last step 227, and 7 steps
done again where 10 were).

The lost attempt's last step is the newest of its ranks' last labelled lines (a rank's last in
file order: an in-process restart stays in the same log, its steps before the restart are
higher and older; the newest across ranks, whose lines may lag: review 49 #4, review 50 #5),
taken only when it is newer than the store's last sample of the attempt and higher than its
step, as the agent keeps a high-water (an evaluation's `iter 5` after the last training step,
or a line cut short, never lowers it: review 50 #4), and only in an attempt whose ranks did not
report their own progress (`trainguard.progress`: their log lines may number something else,
micro-batches or an evaluation's batches, as the node agent reads them then; review 49 #5). A
progress bar's count is never read (it may be an evaluation's: node/logs.py); a last line
with no newline is one cut short (the agent writes whole lines) and is not read.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from trainguard.controller.incidents import IncidentBook
from trainguard.controller.shown import last_sign_of_life
from trainguard.controller.store import JobStore
from trainguard.diagnosis.lines import split_prefix
from trainguard.errors import StoreError
from trainguard.hang.step_lines import bar_groups, step_read
from trainguard.paths import attempt_log_dir
from trainguard.records import iso
from trainguard.states import JobState
from trainguard.worker.contract import STAMP_PATTERN

TAIL_BYTES = 64 << 10  # of each rank log: the last lines are what is read
_STAMP = re.compile("^" + STAMP_PATTERN)
# meta: the newest attempt in which a rank reported its own progress (trainguard.progress)
SELF_REPORTED = "self_reported_attempt"


@dataclass(frozen=True)
class LoggedEnd:
    written: float | None  # when a rank log of the attempt was last written, epoch seconds
    steps: dict[int, tuple[int, float]]  # rank -> (its last labelled step, that line's time)

    def newest(self) -> tuple[int, float] | None:
        """The newest of the ranks' last steps, with its line's time; None without one."""
        return max(self.steps.values(), key=lambda s: (s[1], s[0]), default=None)


def read_logged_end(log_dir: Path, attempt: int, step_pattern: str, *,
                    steps: bool = True) -> LoggedEnd:
    """What the tails of `attempt`'s rank logs say of its end (`steps` False: only when they
    were last written)."""
    step_rx = re.compile(step_pattern)
    bars = bar_groups(step_pattern)
    written: float | None = None
    last: dict[int, tuple[int, float]] = {}
    for log in attempt_log_dir(log_dir, attempt).glob("rank-*.log"):
        try:
            written = max(written or 0.0, log.stat().st_mtime)
            rank = int(log.stem.removeprefix("rank-"))
            if not steps:
                continue
            lines = whole_tail_lines(log)
        except (OSError, ValueError):
            continue
        for line in reversed(lines):
            m = _STAMP.match(line)
            read = step_read(step_rx, bars, line[m.end():]) if m else None
            if m is None or read is None or read[1]:
                continue
            try:
                last[rank] = (int(read[0]), datetime.fromisoformat(m.group(1)).timestamp())
            except ValueError:
                continue
            break
    return LoggedEnd(written, last)


def whole_tail_lines(log: Path) -> list[str]:
    """The whole lines of a rank log's last TAIL_BYTES: a first one cut in two and a last
    one cut short (no newline yet: the agent writes whole lines) are left out. OSError."""
    with open(log, "rb") as f:
        size = f.seek(0, 2)
        f.seek(max(0, size - TAIL_BYTES))
        text = f.read().decode("utf-8", "replace")
    lines = text.splitlines()[1 if size > TAIL_BYTES else 0:]
    return lines if text.endswith("\n") else lines[:-1]


def last_stamp(log: Path) -> datetime | None:
    """When a rank log's last stamped whole line was written; None without one (or no log):
    a lost launch's rank whose log just stopped (diagnosis.silent_peer)."""
    try:
        lines = whole_tail_lines(log)
    except OSError:
        return None
    return next((at for line in reversed(lines) if (at := split_prefix(line).at)), None)


def lost_end(stored_step: int | None, stored_sample: tuple[int, int, float] | None,
             logged: LoggedEnd) -> tuple[int | None, tuple[int, float] | None]:
    """(the lost attempt's last step, a progress sample its logs add or None): the newest of
    the ranks' last logged steps when its line is newer than the store's last sample of the
    attempt (`stored_sample`) and its step higher; else the store's (`stored_step`)."""
    step = logged.newest()
    if step is None:
        return stored_step, None
    if stored_sample is not None and (step[1] <= stored_sample[2] or step[0] <= stored_sample[1]):
        return stored_step, None
    if stored_sample is None and stored_step is not None and step[0] <= stored_step:
        return stored_step, None
    return step[0], step


def close_lost_launch(previous: dict[str, Any], store: JobStore, book: IncidentBook,
                      log_dir: Path, step_pattern: str, launched: float) -> str | None:
    """How the previous launch ended (meta `previous`): its recorded state, or `lost` when
    it was left active (this launcher holds the job's lock: the one before died without
    recording its end), with its last sign of life and step; a lost launch's open attempt
    ends there (its incident terminated), and a step its logs show past the store's is a
    progress sample. `launched`: when this launch began (its own events, a failed
    takeover's, are no sign of the lost launch's life)."""
    try:
        state = JobState(previous.get("state"))
    except ValueError:
        return previous.get("state")
    if state.ended:
        return state.value
    last = last_sign_of_life(previous, store.running_records(), store.last_progress_time(),
                             store.last_event_time(before=launched))
    attempt, step = previous.get("attempt"), previous.get("last_step")
    step = step if isinstance(step, int) else None
    if isinstance(attempt, int):  # its ranks' last output (the logs outlive the launcher)
        logged = read_logged_end(log_dir, attempt, step_pattern,
                                 steps=previous.get(SELF_REPORTED) != attempt)
        last = max(last or 0.0, logged.written) if logged.written is not None else last
        with contextlib.suppress(StoreError):
            step, sample = lost_end(step, store.last_sample(attempt), logged)
            if sample is not None:
                store.add_progress([(attempt, *sample)])
    if last is None:
        return JobState.LOST.value
    book.launch_lost(at := datetime.fromtimestamp(last, timezone.utc), step)
    return (f"{JobState.LOST.value} (its launcher died: last sign of life {iso(at)}"
            + ("" if step is None else f", at step {step}") + ")")
