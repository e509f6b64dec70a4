"""What the node agent knows of each running rank's liveness: progress, phases, output, the
CPU and I/O of its process tree and the read calls of its own process (psutil). Feeds
hang.detector.HangDetector through protocol.RankLiveness; decides nothing.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

import psutil

from trainguard.node.accelerators import AcceleratorSampler
from trainguard.protocol import RankLiveness, WorkerMessage
from trainguard.worker.contract import EXIT_SAVE_PHASE, MessageKind

SAMPLE_EVERY_S = 1.0  # psutil over a process tree costs about a millisecond
MAX_PENDING = 10_000  # intervals kept between two reports


@dataclass
class _RankBook:
    pid: int
    last_step: int | None = None
    last_progress_at: datetime | None = None
    last_step_at: datetime | None = None  # when last_step went up (a save or a phase: never)
    second_last_step_at: datetime | None = None  # when it went up the time before
    pending: list[float] = field(default_factory=list)
    phases: list[tuple[str, datetime, float | None]] = field(default_factory=list)
    cpu_s: float | None = None
    io_bytes: int | None = None
    reads: int | None = None
    local_rank: int = 0
    accel_util: int | None = None
    sampled_at: datetime | None = None
    # its memory snapshots (the Checkpointer's), kept apart from its reported progress
    implied_step: int | None = None
    implied_at: datetime | None = None
    implied_pending: list[float] = field(default_factory=list)
    implied_phase_s: float = 0.0  # marked phases since its last snapshot: not its cadence


class LivenessBook:
    """Thread-safe: the log reader thread reports steps while the agent reports liveness."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ranks: dict[int, _RankBook] = {}
        self._sampled = 0.0
        self._accel = AcceleratorSampler()

    def reset(self, pids: dict[int, int], local_ranks: dict[int, int] | None = None) -> None:
        """A fresh book for each rank (a start, an in-process restart: a first step anew);
        a process that lives on keeps when it had trained past (second_last_step_at): a
        survivor that failed right after the next in-process restart had its error taken
        from a line it had trained 30 steps past (walk-through 27)."""
        with self._lock:
            old = self._ranks
            self._ranks = {rank: _RankBook(pid, local_rank=(local_ranks or {}).get(rank, 0),
                                           second_last_step_at=old[rank].second_last_step_at
                                           if rank in old and old[rank].pid == pid else None)
                           for rank, pid in pids.items()}
            self._sampled = 0.0

    def progress(self, rank: int, step: int | None, at: datetime) -> None:
        """A step line, trainguard.progress(step), or a checkpoint save of `rank`."""
        with self._lock:
            r = self._ranks.get(rank)
            if r is None:
                return
            if (r.last_progress_at is not None and at > r.last_progress_at
                    and step is not None and r.last_step is not None
                    and step > r.last_step and not r.phases
                    and len(r.pending) < MAX_PENDING):
                # the gap since the last progress or the end of a phase (an evaluation, a
                # save, a memory snapshot every step), as the detector measures idle time:
                # never a gap that spans a phase, whose end moved last_progress_at
                r.pending.append((at - r.last_progress_at).total_seconds())
            if step is not None and (r.last_step is None or step > r.last_step):
                if r.last_step_at is not None:  # (a survivor's, kept across a reset, stays)
                    r.second_last_step_at = r.last_step_at
                r.last_step_at = at if r.last_step_at is None else max(at, r.last_step_at)
            if r.last_progress_at is None or at >= r.last_progress_at:
                r.last_progress_at = at
                if step is not None:
                    r.last_step = step

    def implied(self, rank: int, step: int, at: datetime) -> None:
        """A memory snapshot of `step` on `rank` (the Checkpointer's): progress implied, kept
        apart from the rank's reported progress (step lines, trainguard.progress, saves) and
        reported beside it; the hang detector goes by it only while no rank of the job reports
        progress of its own (walk-through 40 #2: a job that printed no steps hung after its
        snapshots and waited out the 30-minute start-up allowance; review 49 #1, review 50
        #1 #2: mixed into a rank's own progress, it turned step lines off, taught a cadence of
        1 ms, and judged a silent rank by its snapshots beside one that prints). Its interval
        is from the snapshot before (its phase's end is no progress of it), less the marked
        phases between (an evaluation's time is not the cadence: review 51 #1); none while a
        phase is open."""
        with self._lock:
            r = self._ranks.get(rank)
            if r is None or (r.implied_step is not None and step <= r.implied_step):
                return
            if r.implied_at is not None and at > r.implied_at and not r.phases \
                    and len(r.implied_pending) < MAX_PENDING:
                gap = (at - r.implied_at).total_seconds() - r.implied_phase_s
                if gap > 0:
                    r.implied_pending.append(gap)
            r.implied_step, r.implied_at, r.implied_phase_s = step, at, 0.0

    def saving_on_exit(self) -> bool:
        """Whether a rank saves a checkpoint on its way out now (its phase says so)."""
        with self._lock:
            return any(p[0] == EXIT_SAVE_PHASE for r in self._ranks.values() for p in r.phases)

    def second_last_step_at(self, rank: int) -> datetime | None:
        """When `rank` reached the step before its latest (None: fewer than two new steps
        yet, or not one of the ranks started last): what it logged before that, it trained
        past (two new steps came after it; one could be a progress bar drawn at exit)."""
        with self._lock:
            r = self._ranks.get(rank)
            return None if r is None else r.second_last_step_at

    def message(self, rank: int, m: WorkerMessage) -> None:
        """A worker message that is a liveness signal: a phase begun or ended, a checkpoint
        saved (the step: none new); any other kind is none."""
        if m.kind == MessageKind.PHASE:
            timeout = m.data.get("timeout_s")
            self.phase(rank, str(m.data["name"]), str(m.data["state"]), m.at,
                       None if timeout is None else float(timeout))
        elif m.kind == MessageKind.CHECKPOINT_SAVED:
            self.progress(rank, None, m.at)

    def phase(self, rank: int, name: str, state: str, at: datetime,
              timeout_s: float | None) -> None:
        """trainguard.phase(name) began or ended on `rank` (phases nest)."""
        with self._lock:
            r = self._ranks.get(rank)
            if r is None:
                return
            if state == "begin":
                r.phases.append((name, at, timeout_s))
            elif state == "end":
                for i in range(len(r.phases) - 1, -1, -1):
                    if r.phases[i][0] == name:
                        if i == 0 and r.implied_at is not None:  # an outermost phase's time
                            since = max(r.phases[0][1], r.implied_at)  # is no snapshot gap
                            r.implied_phase_s += max(0.0, (at - since).total_seconds())
                        del r.phases[i:]
                        break
                # the end of a phase is progress (its work is done), once the rank has made
                # progress at all: before, the start-up allowance still applies
                if r.last_progress_at is not None:
                    r.last_progress_at = max(at, r.last_progress_at)

    def sample(self) -> None:
        """CPU and I/O of each rank's process tree, and its own process's read calls, at most
        once per SAMPLE_EVERY_S."""
        now = time.monotonic()
        if now - self._sampled < SAMPLE_EVERY_S:
            return
        self._sampled = now
        with self._lock:
            pids = {rank: r.pid for rank, r in self._ranks.items()}
        found = {rank: _tree_usage(pid) for rank, pid in pids.items()}
        util = self._accel.latest()
        devices = visible_devices()
        stamp = datetime.now(timezone.utc)
        with self._lock:
            for rank, (cpu, io, reads) in found.items():
                r = self._ranks.get(rank)
                if r is not None:
                    r.cpu_s, r.io_bytes, r.reads, r.sampled_at = cpu, io, reads, stamp
                    # local rank i uses the i-th visible device (CUDA_VISIBLE_DEVICES order)
                    dev = (devices[r.local_rank] if devices is not None
                           and r.local_rank < len(devices) else r.local_rank)
                    r.accel_util = util.get(dev)

    def report(self, running: set[int], last_output: dict[int, datetime],
               unread: dict[int, tuple[str, str | None]] | None = None
               ) -> list[RankLiveness]:
        """Liveness of the running ranks; the intervals reported are dropped here.
        `unread`: per rank, a line that counts like steps the step pattern did not read."""
        out = []
        with self._lock:
            for rank in sorted(running):
                r = self._ranks.get(rank)
                if r is None:
                    continue
                phase = r.phases[-1] if r.phases else None
                line, pattern = (unread or {}).get(rank, (None, None))
                out.append(RankLiveness(
                    rank=rank, last_step=r.last_step, last_progress_at=r.last_progress_at,
                    intervals=r.pending, phase=phase[0] if phase else None,
                    phase_since=phase[1] if phase else None,
                    phase_timeout_s=phase[2] if phase else None,
                    last_output_at=last_output.get(rank),
                    unread_step_line=line, unread_step_pattern=pattern,
                    cpu_s=r.cpu_s, io_bytes=r.io_bytes, reads=r.reads,
                    accel_util=r.accel_util, sampled_at=r.sampled_at,
                    implied_step=r.implied_step, implied_at=r.implied_at,
                    implied_intervals=r.implied_pending))
                r.pending, r.implied_pending = [], []
        return out


def visible_devices() -> list[int] | None:
    """CUDA_VISIBLE_DEVICES (or ASCEND_RT_VISIBLE_DEVICES) as device indices, if numeric."""
    for var in ("CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES"):
        raw = os.environ.get(var)
        if raw:
            ids = [x.strip() for x in raw.split(",")]
            return [int(x) for x in ids] if all(x.isdigit() for x in ids) else None
    return None


def _tree_usage(pid: int) -> tuple[float | None, int | None, int | None]:
    """(CPU seconds, bytes read + written) of a process and its descendants, and the read
    calls of the process itself (every thread's, not its children's: the batches its data
    loader's worker processes send arrive as reads of a pipe)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except (psutil.Error, OSError):
        return None, None, None
    cpu, io, reads = 0.0, 0, None
    for p in procs:
        with contextlib.suppress(psutil.Error, OSError):
            t = p.cpu_times()
            cpu += t.user + t.system
        with contextlib.suppress(psutil.Error, OSError, AttributeError):
            c = p.io_counters()
            io += int(getattr(c, "read_chars", c.read_bytes)) + int(
                getattr(c, "write_chars", c.write_bytes))
            if p is root:
                reads = int(c.read_count)
    return cpu, io, reads
