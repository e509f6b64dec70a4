"""The job's high-water marks: the furthest step and checkpoint any attempt reached. An
incident made progress when its attempt got beyond them (the restart policy resets its
consecutive counters and backoff on progress)."""

from __future__ import annotations

from trainguard.protocol import NodeReport
from trainguard.records import RunningRecord, utcnow

# A job that never prints a step line still makes progress if an attempt lived this long.
MIN_UPTIME_FOR_PROGRESS_S = 60.0
# A step is new ground only beyond the furthest one by more than the jitter of where one
# failure lands: the ranks of one step are a step or two apart (the job's step is the
# furthest rank's), and a failure at a fixed time (a leak, a timer) ends a few steps either
# way, a share of the steps the attempt ran (not of the job's step count: an attempt resumed
# at step 100,000 that ran 720 steps got further). Else such attempts creep the mark up a
# step at a time and escape the no-progress guard.
JITTER_STEPS = 2
JITTER_FRACTION = 0.01


def jitter(span: int) -> int:
    """How far beyond the furthest step an attempt that ran `span` steps must get."""
    return max(JITTER_STEPS, int(max(span, 0) * JITTER_FRACTION))


class HighWater:
    def __init__(self, max_step: int | None = None, max_committed: int | None = None) -> None:
        self.max_step = max_step
        self.max_committed = max_committed

    def made_progress(self, report: NodeReport, committed: int | None,
                      record: RunningRecord | None, allow_uptime: bool = True) -> bool:
        """New ground: a checkpoint (`committed` this attempt) or a step beyond every
        earlier one by more than the jitter (or a long life, for crashes: a hang always
        lives long, so it does not count there). Reads only."""
        last = report.progress.last_step
        new_ckpt = committed is not None and committed > (self.max_committed or -1)
        first = report.progress.first_step
        span = 0 if last is None or first is None else last - first
        new_step = last is not None and (
            self.max_step is None or last > self.max_step + jitter(span))
        if new_ckpt or new_step:
            return True
        if allow_uptime and last is None and self.max_step is None and record is not None:
            return (utcnow() - record.start_at).total_seconds() >= MIN_UPTIME_FOR_PROGRESS_S
        return False

    def note(self, report: NodeReport, committed: int | None) -> None:
        """Move the marks to this attempt's checkpoint and step."""
        last = report.progress.last_step
        if committed is not None:
            self.max_committed = max(committed, self.max_committed or committed)
        if last is not None:
            self.max_step = max(last, self.max_step or last)

    def stuck(self) -> str:
        """Where attempts that made no progress got stuck, in words (the NoProgress event)."""
        where = (f"no attempt got beyond step {self.max_step}" if self.max_step is not None
                 else "no attempt reported a step")
        if self.max_committed is not None:
            return f"{where} or committed a checkpoint beyond step {self.max_committed}"
        if self.max_step is None:  # trainguard saw no step: a script of its own format may
            # have got further each attempt (walk-through 28: given up with 86, "do not
            # requeue", while its own checkpoints moved on)
            return (f"{where} and none committed a checkpoint trainguard saw, so each seemed to "
                    "start over; a script that prints steps in a format of its own and saves "
                    "its own checkpoints may have got further: pass --step-pattern (the "
                    "NoProgressSignal event names one) or call trainguard.progress(step), "
                    "else save checkpoints to resume past the failure, or fix what fails there")
        return (f"{where}, and none committed a checkpoint trainguard saw, so each started "
                "over from the beginning, unless the script resumes from checkpoints of its "
                "own (save checkpoints to resume past the failure, or fix what fails there)")
