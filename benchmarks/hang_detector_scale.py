"""The hang detector's cost per poll at scale: `python benchmarks/hang_detector_scale.py`.

One HangDetector (hang/detector.py, the controller runs it at every poll of the job's
liveness) fed the RankLiveness of N ranks a poll, N in --ranks (64 .. 4096), in two shapes:

* `every rank steps`: each rank reports its new progress intervals (--intervals a poll: a
  step of 0.1 s at a 1 s poll is 10), as ranks that report their own steps do;
* `rank 0 steps`: only rank 0 reports progress (a script whose other ranks print nothing and
  call no trainguard.progress): the others are judged by the job's last progress;
* `every rank saves`: every rank in the library's `checkpoint` phase (a save of every rank's
  shard), rank 0 outside it having done its part: the phases lent (hang/lenders.py);
* `rank 0 evaluates`: rank 0 in a marked `eval` phase, every other rank waiting outside it.

Each shape runs --polls polls after --warm polls (the first attempt's warm-up: learning the
cadence) and prints the median and worst milliseconds of one `observe` and the microseconds
per rank; linear cost keeps the per-rank figure flat as N grows. Pure Python, one process:
the detector's share of the controller's CPU, no I/O.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from trainguard.hang.detector import HangDetector
from trainguard.protocol import RankLiveness

SHAPES = ("every rank steps", "rank 0 steps", "every rank saves", "rank 0 evaluates")


def poll(n: int, shape: str, intervals: int, at: datetime, i: int) -> list[RankLiveness]:
    every = shape != "rank 0 steps"
    steps = [0.1] * intervals
    out = []
    for r in range(n):
        phase = None
        if i % 2:  # the phases open at every other poll: a rank left one at the poll before
            if shape == "every rank saves" and r:
                phase = "checkpoint"
            elif shape == "rank 0 evaluates" and not r:
                phase = "eval"
        out.append(RankLiveness(rank=r, last_step=1,
                                last_progress_at=at if every or r == 0 else None,
                                intervals=steps if every or r == 0 else [], last_output_at=at,
                                phase=phase, phase_since=at if phase else None))
    return out


def measure(n: int, shape: str, args: argparse.Namespace) -> tuple[float, float]:
    det = HangDetector()
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    det.start_attempt(t0)
    times = []
    for i in range(args.warm + args.polls):
        now = t0 + timedelta(seconds=i + 1)
        liveness = poll(n, shape, args.intervals, now, i)  # built outside the timing
        start = time.perf_counter()
        det.observe(liveness, now)
        if i >= args.warm:
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3, max(times) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[64, 256, 1024, 4096])
    p.add_argument("--intervals", type=int, default=10, help="progress intervals a poll")
    p.add_argument("--warm", type=int, default=3)
    p.add_argument("--polls", type=int, default=10)
    p.add_argument("--shapes", nargs="+", choices=SHAPES, default=list(SHAPES))
    args = p.parse_args()
    print("| shape | ranks | median ms / poll | worst ms / poll | us / rank |")
    print("|---|---:|---:|---:|---:|")
    for shape in args.shapes:
        for n in args.ranks:
            med, worst = measure(n, shape, args)
            print(f"| {shape} | {n} | {med:.2f} | {worst:.2f} | {med * 1e3 / n:.1f} |",
                  flush=True)


if __name__ == "__main__":
    main()
