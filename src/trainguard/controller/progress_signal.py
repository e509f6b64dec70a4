"""A job whose ranks print but report no progress: hang detection, `--restart-on-hang` and
the no-progress guard have nothing to go by (walk-through 21: a loop logging `INFO:root:step
5` through `logging`, before the default pattern read such lines, sat hung for the 30-minute
start-up allowance with no word). `NoProgressSignal` (Warning), once per launch, when the
ranks have printed for SILENT_WARN_S and no rank reported a step (a step line,
`trainguard.progress`, a checkpoint trainguard saw); at once when a rank's lines count up like
steps in a format the pattern does not read (hang/step_lines.py), quoting one and a
--step-pattern that reads it (walk-through 28: `it 15 | loss 0.83` went unread, a hang sat out
the 30-minute start-up allowance in silence). Pure bookkeeping over the reports; the recorder
writes the event."""

from __future__ import annotations

from datetime import datetime

from trainguard.controller.recorder import Recorder
from trainguard.protocol import NodeReport
from trainguard.records import Level, Reason

# long enough for a model to load and the first step to end, short enough to be told before
# the night is lost
SILENT_WARN_S = 180.0


class ProgressSignal:
    def __init__(self, rec: Recorder, warn_after_s: float = SILENT_WARN_S) -> None:
        self.rec = rec
        self.warn_after_s = warn_after_s
        self._printing_since: datetime | None = None  # this attempt's first output
        self._attempt: int | None = None
        self._done = False  # told, or progress seen: nothing more to say this launch

    def observe(self, report: NodeReport, attempt: int) -> None:
        if self._done:
            return
        if report.progress.last_step is not None or any(
                lv.last_progress_at is not None for lv in report.liveness):
            self._done = True
            return
        if attempt != self._attempt:  # new processes: their own output
            self._attempt, self._printing_since = attempt, None
        printed = [lv.last_output_at for lv in report.liveness if lv.last_output_at]
        if not printed:
            return
        self._printing_since = self._printing_since or min(printed)
        counting = next((lv for lv in report.liveness if lv.unread_step_line), None)
        # still printing: a rank that said "loading..." and went quiet loads, it says no step
        if counting is None and (
                max(printed) - self._printing_since).total_seconds() < self.warn_after_s:
            return
        self._done = True
        spec = self.rec.spec
        needs = ("hang detection, --restart-on-hang and the no-progress guard"
                 if spec.hang_detection and spec.restart_on_hang else
                 "hang detection and the no-progress guard" if spec.hang_detection else
                 "the no-progress guard")
        snapshots = any(lv.implied_at is not None for lv in report.liveness)
        if snapshots:  # hang detection goes by them (node/liveness.py)
            needs = "the no-progress guard"
        lacks = ("has" if needs == "the no-progress guard" else "have") + " nothing to go by" \
            + (" (hang detection goes by the ranks' memory snapshots)" if snapshots else "")
        if counting is not None:
            line, pattern = str(counting.unread_step_line).strip(), counting.unread_step_pattern
            self.rec.event(Level.WARNING, Reason.NO_PROGRESS_SIGNAL,
                           f"rank {counting.rank}'s lines count up like steps (`{line[:120]}`) "
                           f"but --step-pattern does not read them, so {needs} {lacks}. Fix: "
                           + (f"--step-pattern '{pattern}' (its first group is the step), "
                              if pattern else "pass --step-pattern with a regex whose first "
                              "group is your step number, ")
                           + "or call trainguard.progress(step) after each step "
                           "(docs/hang-detection.md)", rank=counting.rank, attempt=attempt)
            return
        self.rec.event(Level.WARNING, Reason.NO_PROGRESS_SIGNAL,
                       f"no progress signal after {self.warn_after_s:.0f}s: the ranks print, "
                       "but no line matched --step-pattern, no rank called "
                       "trainguard.progress(step) and no checkpoint was seen, so "
                       f"{needs} {lacks}. Fix: print `step N` at the start of "
                       "a line (after any [..] or logging prefix), pass --step-pattern with a "
                       "regex whose first group is your step number, or call "
                       "trainguard.progress(step) after each step (docs/hang-detection.md)",
                       attempt=attempt)
