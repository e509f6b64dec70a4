"""What a lost launch's rank logs say of its end (the logs outlive a launcher killed with
SIGKILL): when its ranks last wrote, and the last step they printed. Progress reaches the
store in batches, so the steps of a dead launcher's last second or so were in the logs only:
the relaunch read the time of the logs' last line and the store's older step together
(walk-through 40 #3: a record ending at a `step 230` line said last step 227, and 7 steps
done again where 10 were)."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

from trainguard.paths import attempt_log_dir
from trainguard.presets import DEFAULT_BAR_GROUPS, DEFAULT_STEP_PATTERN, step_read

TAIL_BYTES = 64 << 10  # of each rank log: the last lines are what is read


def logged_end(log_dir: Path, attempt: int, step_pattern: str
               ) -> tuple[float | None, tuple[int, float] | None]:
    """(when a rank log of `attempt` was last written, epoch seconds; the highest step a
    labelled line of their tails reports, with its line's time), None where none is known.
    A progress bar's count is not read (it may be an evaluation's: node/logs.py)."""
    step_rx = re.compile(step_pattern)
    bars = DEFAULT_BAR_GROUPS if step_pattern == DEFAULT_STEP_PATTERN else frozenset()
    written: float | None = None
    best: tuple[int, float] | None = None
    for log in attempt_log_dir(log_dir, attempt).glob("rank-*.log"):
        try:
            size = log.stat().st_size
            written = max(written or 0.0, log.stat().st_mtime)
            with open(log, "rb") as f:
                f.seek(max(0, size - TAIL_BYTES))
                lines = f.read().decode("utf-8", "replace").splitlines()
        except OSError:
            continue
        for line in lines[1:] if size > TAIL_BYTES else lines:  # (a first one cut in two)
            stamp, _, rest = line.partition(" ")
            text = rest.partition(" ")[2]
            read = step_read(step_rx, bars, text)
            if read is None or read[1]:
                continue
            try:
                at = datetime.fromisoformat(stamp).timestamp()
            except ValueError:
                continue
            if best is None or int(read[0]) > best[0]:
                best = (int(read[0]), at)
    return written, best
