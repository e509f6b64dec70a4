"""Is the job hung? Pure: per-rank progress and activity over time -> a hang verdict.

Progress is what moves the training forward: a step line in the log, `trainguard.progress`,
a checkpoint save. The detector learns the job's cadence from the intervals between
progress events (all ranks pooled, the last `window` of them) and judges each rank by how
long it has gone without progress:

- **threshold** T = `--hang-timeout` when given, else max(k x p99 interval, floor). k = 3:
  a healthy step is slower than its p99 once in a hundred, three times slower almost never
  (a job whose step time varies 10x has a p99 near the slow end, so 3x p99 still clears
  it). floor = 8 s: restarts, GC pauses and first iterations after a resume stall for a few
  seconds even in jobs with 20 ms steps, and 8 s keeps a steady job's confirmation within
  3 x p99 + 10 s with room for the polling and the stack dump.
- **allowances**: before the first progress of an attempt, `startup_s` (loading, compiling,
  the rendezvous); while a rank is in a phase it marked (`trainguard.phase`, a checkpoint
  save), the phase's own timeout or `phase_s`, for it and for the ranks outside a phase (they
  wait for it: a barrier, the next collective); once a rank of the attempt exited 0 (the job
  is ending: the others are finishing or tearing down), `phase_s` too.
- **suspected** at 2/3 of T: a Warning, nothing is done.
- **confirmed** at T when the activity signals agree that nothing is being done: no rank
  printed a line lately (since the suspicion, within the last third of T), no rank's process
  tree read or wrote more than `io_life_bytes` since the last sample, and no rank's
  accelerator load varies (NVML / npu-smi, where there is one: NCCL kernels spin at a flat
  100% while a collective hangs, so only a varying load is work). CPU alone is not life (a
  rank spinning in a loop, or busy-polling a collective, is as hung as one that sleeps).
  While there is life,
  confirmation waits, up to `life_cap` x T.
- **work that reports no step**: while a hang is suspected the controller looks at the stuck
  ranks' Python stacks (controller/hang_watch.py); while a rank outside a marked phase is
  found at two places within the last minute, or waiting in its data loader while its process
  reads what the loader's workers send (`reads_rose`: batches arrive), it works at something
  that reports no step (an evaluation no `trainguard.phase` marks; `seen_working`, told
  again at each look): confirmation waits, up to the phase allowance, and comes
  `motion_fresh_s` after the looks stop saying so.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum

from trainguard.hang.lenders import Lenders
from trainguard.protocol import RankLiveness
from trainguard.records import rank_list
from trainguard.worker.contract import CHECKPOINT_PHASE, EXIT_SAVE_PHASE, EXITING_PHASE

ACCEL_SAMPLES = 10  # the last utilisation samples of a rank's accelerator
ACCEL_VARYING = 10  # percentage points between min and max that mean "working"
# the phases the library marks itself: a save's or load's blocking part (every rank enters it:
# its allowance is lent only to a rank that did its part), the attempt ending (never lent)
ENDING = frozenset({EXIT_SAVE_PHASE, EXITING_PHASE})
LIBRARY_PHASES = ENDING | {CHECKPOINT_PHASE}


class HangState(str, Enum):
    OK = "ok"
    SUSPECTED = "suspected"
    CONFIRMED = "confirmed"


@dataclass(frozen=True)
class HangPolicy:
    k: float = 3.0
    floor_s: float = 8.0
    fixed_s: float | None = None
    startup_s: float = 1800.0
    phase_s: float = 1800.0
    suspect_fraction: float = 2 / 3
    io_life_bytes: int = 1 << 20
    life_cap: float = 10.0
    window: int = 2000
    motion_fresh_s: float = 10.0  # a moving stack holds a confirmation off this long after
    # fewer learned steps: the start-up allowance (or the fixed timeout); a gap counts as the
    # steps it covers (progress is sent at most every 0.2 s: a job of fast steps reports one
    # gap for many; walk-through 39 #2: 14 steps, one gap, 30 minutes of silence allowed)
    min_intervals: int = 3


@dataclass(frozen=True)
class HangVerdict:
    state: HangState
    stuck_ranks: tuple[int, ...] = ()
    last_progress_at: datetime | None = None  # the job's, for the stuck ranks
    idle_s: float = 0.0
    threshold_s: float = 0.0
    p99_s: float | None = None
    basis: str = ""
    waiting_for: str | None = None  # why a suspected hang is not confirmed yet

    def describe(self) -> str:
        ranks = rank_list(self.stuck_ranks) or "none"
        return (f"no progress for {self.idle_s:.1f}s on rank(s) {ranks} (threshold "
                f"{self.threshold_s:.1f}s: {self.basis})")


def p99(values: Iterable[float]) -> float | None:
    xs = sorted(values)
    if not xs:
        return None
    return xs[min(len(xs) - 1, math.ceil(0.99 * len(xs)) - 1)]


@dataclass
class _Rank:
    last_progress_at: datetime | None = None
    last_output_at: datetime | None = None
    io_bytes: int | None = None
    io_grew: bool = False
    reads: int | None = None  # read calls of the rank's own process (all its threads)
    # the samples (the one before, the one that saw it) of the last rise of `reads`
    reads_rose: tuple[datetime, datetime] | None = None
    sampled_at: datetime | None = None
    working_at: datetime | None = None  # the controller saw it work (hang_watch.py)
    phase: str | None = None  # the phase it marked, at the last poll
    accel: deque[int] = field(default_factory=lambda: deque(maxlen=ACCEL_SAMPLES))
    gaps: int = 0  # steps its progress intervals covered in this attempt
    last_step: int | None = None  # its step at the last poll
    left_phase_at: datetime | None = None  # when its last phase ended
    reported_at: datetime | None = None  # its own progress (last_progress_at as reported)
    implied_at: datetime | None = None  # its last memory snapshot
    implied_step: int | None = None


@dataclass
class HangDetector:
    """One per job: `start_attempt` at each attempt, `observe` at each poll."""

    policy: HangPolicy = field(default_factory=HangPolicy)
    intervals: deque[float] = field(default_factory=deque)
    _started_at: datetime | None = None
    _ranks: dict[int, _Rank] = field(default_factory=dict)
    _state: HangState = HangState.OK
    _suspected_at: datetime | None = None
    _past_motion_cap: bool = False  # the last confirmation came after a moving stack's cap
    # the first min_intervals gaps of an attempt (a new process warms up again: compiles,
    # autotunes, fills caches): this attempt's, and the last earlier attempt's that made
    # some (walk-through 33 #5; only the last: one stall must not stretch every later one)
    _warm_now: list[float] = field(default_factory=list)
    _warm_before: list[float] = field(default_factory=list)
    _phase_ended_at: datetime | None = None  # a rank's marked phase last ended (this attempt)
    _most_gaps: int = 0  # the most steps one rank's intervals covered in this attempt
    _learned_steps: int = 0  # the steps the learned intervals covered (each gap at least 1)
    # a rank of the job reported a step (a line, trainguard.progress): memory snapshots are
    # no progress from then on (while none did, they are: walk-through 40 #2)
    _steps_reported: bool = False

    def start_attempt(self, at: datetime) -> None:
        """Clocks restart; the learned cadence is kept (it is the job's, not the attempt's),
        and so are the first steps' gaps of the attempt that ends: the next attempt's first
        steps get as long (warm-up)."""
        self._started_at, self._ranks = at, {}
        self._state, self._suspected_at = HangState.OK, None
        self._warm_before = self._warm_now or self._warm_before
        self._warm_now, self._phase_ended_at, self._most_gaps = [], None, 0

    def learned_p99(self) -> float | None:
        if not self.intervals or self._learned_steps < self.policy.min_intervals:
            return None
        return p99(self.intervals)

    def threshold(self) -> tuple[float, str]:
        pol = self.policy
        if pol.fixed_s is not None:
            return pol.fixed_s, f"fixed --hang-timeout {pol.fixed_s:g}s"
        q = self.learned_p99()
        if q is None:  # too few intervals to know the cadence: a slow step is not a hang
            t = max(pol.startup_s, pol.floor_s)
            return t, f"start-up allowance {t:g}s (cadence not learned yet)"
        t = max(pol.k * q, pol.floor_s)
        warm = pol.k * max(self._warm_before) if self._warm_before else 0.0
        if warm > t and self._warming():
            return warm, (f"warm-up allowance {warm:g}s: {pol.k:g} x the slowest of the first "
                          f"{pol.min_intervals} steps of the last attempt, until this one has "
                          "made as many")
        return t, f"max({pol.k:g} x p99 {q:.3f}s, floor {pol.floor_s:g}s)"

    def _warming(self) -> bool:
        """Whether no rank has made min_intervals steps in this attempt yet (kept as a running
        maximum: asked for each interval a poll brings, a max over the ranks cost O(N^2))."""
        return self._most_gaps < self.policy.min_intervals

    def observe(self, liveness: list[RankLiveness], now: datetime,
                ending: str | None = None) -> HangVerdict:
        """`liveness`: the ranks still running; `ending`: why the job is ending (a rank
        exited 0), when it is: the ranks left get the ending allowance."""
        if not self._steps_reported and any(rl.last_step is not None for rl in liveness):
            self._forget_implied()
        for rl in liveness:
            self._update(rl, now)
        threshold, basis = self.threshold()
        if not self._steps_reported and any(r.implied_at for r in self._ranks.values()):
            basis += "; progress: the ranks' memory snapshots (no rank reports steps)"
        stuck: list[tuple[int, float, float]] = []  # rank, idle seconds, its allowance
        phased = [rl for rl in liveness if rl.phase is not None and rl.phase not in ENDING]
        lenders = Lenders(phased, lambda q: self._phase_allowance(q, threshold))
        known = [r.last_progress_at for r in self._ranks.values() if r.last_progress_at]
        job_last = max(known) if known else None  # once a poll, not once a rank
        for rl in liveness:
            idle, allowed, why = self._idle(rl, now, threshold, lenders, job_last)
            if ending is not None and allowed < max(self.policy.phase_s, threshold):
                allowed = max(self.policy.phase_s, threshold)
                why = f"job ending ({ending}): allowance {allowed:g}s"
            if idle > allowed * self.policy.suspect_fraction:
                stuck.append((rl.rank, idle, allowed))
                basis = why or basis
        if not stuck:
            self._state, self._suspected_at = HangState.OK, None
            return HangVerdict(HangState.OK, threshold_s=threshold, p99_s=self.learned_p99(),
                               basis=basis)
        ranks = tuple(r for r, _, _ in stuck)
        idle = max(i for _, i, _ in stuck)
        allowed = min(a for _, _, a in stuck)
        last = [self._ranks[r].last_progress_at for r in ranks]
        known = [t for t in last if t is not None]
        since = min(known) if known else self._started_at
        fresh = self._state == HangState.OK  # two stages: confirmed at a later poll
        if fresh:
            self._state, self._suspected_at = HangState.SUSPECTED, now
        waiting = None
        if self._state == HangState.SUSPECTED and idle > allowed and not fresh:
            waiting, cap = self._life(liveness, now, allowed)
            if waiting is None or idle > cap:
                self._state = HangState.CONFIRMED
                self._past_motion_cap = idle > self._motion_cap(allowed)
        return HangVerdict(self._state, ranks, since, idle, allowed, self.learned_p99(), basis,
                           waiting if self._state != HangState.CONFIRMED else None)

    def seen_working(self, ranks: Iterable[int], at: datetime) -> bool:
        """The controller saw these ranks work at something that reports no step
        (controller/hang_watch.py: a Python stack that moves, a data loader that hands over
        batches), so for `motion_fresh_s` the suspicion has the
        allowance of a marked phase, and the hang just confirmed is not one, unless it has
        gone past that allowance. A rank inside a marked phase has that phase's own timeout
        instead. True: not confirmed."""
        moved = [r for r in ranks if self._ranks.setdefault(r, _Rank()).phase is None]
        for rank in moved:
            self._ranks[rank].working_at = at
        if not moved or self._state != HangState.CONFIRMED or self._past_motion_cap:
            return False
        self._state = HangState.SUSPECTED
        return True

    def reads_rose(self, rank: int) -> tuple[datetime, datetime] | None:
        """Between which two samples the read calls of `rank`'s own process last went up
        (None: never seen, or not sampled): a rank waiting in its data loader receives each
        batch from the loader's workers as reads, and one whose workers are stuck or dead
        reads nothing."""
        r = self._ranks.get(rank)
        return None if r is None else r.reads_rose

    def hold(self) -> None:
        """The hang just confirmed waits for more evidence (controller/hang_watch.py: too few
        looks at the stuck ranks' stacks yet to say they sit still); the next poll decides
        again."""
        if self._state == HangState.CONFIRMED:
            self._state = HangState.SUSPECTED

    # -- internals ------------------------------------------------------------------------

    def _forget_implied(self) -> None:
        """A rank reported its first step: the snapshots' progress and cadence are dropped
        (their steps may count otherwise; a silent rank beside one that prints is judged
        by the job's progress again, review 50 #2)."""
        self._steps_reported = True  # every interval learned so far was a snapshot's (a
        self.intervals.clear()  # reported one comes with a step, which ends this first)
        self._learned_steps = self._most_gaps = 0
        self._warm_now = []
        for r in self._ranks.values():
            r.last_progress_at, r.gaps = r.reported_at, 0

    def _learn(self, r: _Rank, intervals: list[float], step: int | None,
               before: int | None) -> None:
        gaps = [x for x in intervals if x >= 0]
        if gaps:  # the steps they cover (a gap of progress sent every 0.2 s spans many)
            covered = step - before if step is not None and before is not None else 0
            if self._warming():
                self._warm_now += gaps
            r.gaps += max(len(gaps), covered)
            self._learned_steps += max(len(gaps), covered)
            self._most_gaps = max(self._most_gaps, r.gaps)
            self.intervals.extend(gaps)

    def _update(self, rl: RankLiveness, now: datetime) -> None:
        r = self._ranks.setdefault(rl.rank, _Rank())
        self._learn(r, rl.intervals, rl.last_step, r.last_step)
        if rl.last_step is not None:
            r.last_step = rl.last_step
        if not self._steps_reported and rl.implied_step is not None:  # its snapshots
            self._learn(r, rl.implied_intervals, rl.implied_step, r.implied_step)
            r.implied_step, r.implied_at = rl.implied_step, rl.implied_at
        while len(self.intervals) > self.policy.window:
            self.intervals.popleft()
        if rl.last_progress_at is not None:
            r.reported_at = rl.last_progress_at
        r.last_progress_at = max((t for t in (r.reported_at, None if self._steps_reported
                                              else r.implied_at) if t is not None), default=None)
        r.last_output_at = rl.last_output_at
        if r.phase is not None and rl.phase is None:
            r.left_phase_at = now
            if r.phase not in LIBRARY_PHASES:  # the ranks that waited for it go on now
                self._phase_ended_at = now
        r.phase = rl.phase
        if rl.sampled_at is not None and rl.sampled_at == r.sampled_at:
            return  # the same activity sample as at the last poll
        before, r.sampled_at = r.sampled_at, rl.sampled_at
        if rl.io_bytes is not None:
            grew = r.io_bytes is not None and rl.io_bytes - r.io_bytes > self.policy.io_life_bytes
            r.io_grew, r.io_bytes = grew, rl.io_bytes
        if rl.reads is not None:
            if r.reads is not None and rl.reads > r.reads and before is not None \
                    and rl.sampled_at is not None:
                r.reads_rose = (before, rl.sampled_at)
            r.reads = rl.reads
        if rl.accel_util is not None:
            r.accel.append(rl.accel_util)

    def _idle(self, rl: RankLiveness, now: datetime, threshold: float,
              lenders: Lenders, job_last: datetime | None
              ) -> tuple[float, float, str | None]:
        """(seconds without progress, the allowance that applies, why it differs from T).
        A rank outside any phase while another rank is in one gets that phase's allowance too
        (`lenders`: hang/lenders.py says whose). `job_last`: the job's last progress, any
        rank's."""
        last = self._ranks[rl.rank].last_progress_at
        if last is None:  # a rank that reports no progress of its own (only rank 0 logs
            # steps, say) is judged by the job's progress
            last = job_last
        if rl.phase is None and last is not None and self._phase_ended_at is not None:
            last = max(last, self._phase_ended_at)  # it waited for the phase: counts from its end
        p = rl if rl.phase is not None else lenders.lender(
            self._ranks[rl.rank].left_phase_at, threshold)
        if p is not None:
            marks = [t for t in (p.phase_since, last) if t is not None]
            start = max(marks) if marks else (self._started_at or now)
            allowed = self._phase_allowance(p, threshold)
            whose = "" if p is rl else f"rank {p.rank}'s "
            return ((now - start).total_seconds(), allowed,
                    f"{whose}phase {p.phase!r} allowance {allowed:g}s")
        if last is None:
            start = self._started_at or now
            allowed = max(self.policy.startup_s, threshold)
            return (now - start).total_seconds(), allowed, f"start-up allowance {allowed:g}s"
        return (now - last).total_seconds(), threshold, None

    def _phase_allowance(self, rl: RankLiveness, threshold: float) -> float:
        # never below the threshold: a phase is work slow on purpose (review 48 #1: an
        # evaluation's per-batch allowance under slow steps)
        return max(rl.phase_timeout_s or self.policy.phase_s, threshold)

    def _life(self, liveness: list[RankLiveness], now: datetime, threshold: float
              ) -> tuple[str | None, float]:
        """Why the job still looks busy (None when nothing is happening), and how long that
        may hold the confirmation off (seconds without progress): a Python stack seen moving
        (or a data loader seen handing over batches) in the last motion_fresh_s counts as a
        marked phase does (its allowance); a line printed since the suspicion and within the
        last third of the threshold (at least 2 s), more than io_life_bytes read or written
        since the last sample, or a varying accelerator load, up to life_cap x the
        threshold."""
        for rl in liveness:
            moved = self._ranks[rl.rank].working_at
            if (moved is not None and self._suspected_at is not None and rl.phase is None
                    and moved >= self._suspected_at
                    and (now - moved).total_seconds() <= self.policy.motion_fresh_s):
                return (f"rank {rl.rank} works at something that reports no step (an "
                        f"evaluation say: mark it with trainguard.phase)",
                        self._motion_cap(threshold))
        return self._activity(liveness, now, threshold), threshold * self.policy.life_cap

    def _motion_cap(self, threshold: float) -> float:
        """How long a moving stack may hold a confirmation off (seconds without progress)."""
        return max(self.policy.phase_s, threshold * self.policy.life_cap)

    def _activity(self, liveness: list[RankLiveness], now: datetime, threshold: float
                  ) -> str | None:
        recent = max(threshold / 3, 2.0)
        for rl in liveness:
            r = self._ranks[rl.rank]
            out = r.last_output_at
            if (out is not None and self._suspected_at is not None and out > self._suspected_at
                    and (now - out).total_seconds() <= recent):
                return f"rank {rl.rank} still prints output"
            if r.io_grew:
                return f"rank {rl.rank} still reads or writes"
            if len(r.accel) >= 3 and max(r.accel) - min(r.accel) >= ACCEL_VARYING:
                return f"rank {rl.rank}'s accelerator load still varies"
        return None
