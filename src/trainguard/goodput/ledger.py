"""Where a job's wall time went: productive steps and badput by cause. Pure: no I/O.

The definition (docs/goodput.md): the wall time runs from the job's first launch to its end
(now while it runs; a lost launcher's last sign of life). Every instant of it gets exactly
one cause, so the parts add up to the wall time. Instants are painted in layers; where layers
overlap the higher one wins (`_LAYERS`, lowest first):

- other       whatever no layer claims: teardown after the last step, a failed job's end
- queued      between two launches of the same job (requeued, not running), and a
              reschedule's wait for healthy nodes (a Queuing event -> the next attempt)
- stopped     (not badput) a person stopped the job: the stop's request -> the next launch
              (or the end); left out of the goodput ratio (walk-through 42 #2: a night's
              stop read as `queued`, and goodput near 0)
- startup     a launch -> its first step (imports, rendezvous, checkpoint load, first step)
- recovery    a restart's workers starting -> their first step; detection -> first step (or
              -> the restart's own failure, when it failed again before a step)
- productive  steps that survive: completed and never done again
- checkpoint_blocking  the training loop waiting on a save or a memory snapshot
- wasted_progress      steps a later attempt did again (it resumed from an earlier
              checkpoint), and the part of a step a crash cut short
- detection   the fault -> the controller noticed it
- hang        the last progress before a hang -> the hang was confirmed; a hang not
              restarted (left running, out of budget) -> progress again or the attempt's end
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from trainguard.goodput.step_counts import Resume, count_steps
from trainguard.goodput.step_time import ideal_step_s
from trainguard.states import JobState

PRODUCTIVE = "productive"
STOPPED = JobState.STOPPED.value  # neither productive nor badput: stopped on purpose
BLOCKING = "checkpoint_blocking"
CAUSES = ("startup", "checkpoint_blocking", "wasted_progress", "detection", "recovery",
          "hang", "queued", "other")
_LAYERS = {"other": 0, "queued": 1, STOPPED: 2, "startup": 3, PRODUCTIVE: 4,
           "checkpoint_blocking": 5, "wasted_progress": 6, "detection": 7, "recovery": 7,
           "hang": 7}


@dataclass(frozen=True)
class Attempt:
    attempt: int
    start: float  # epoch seconds
    end: float | None  # None: still running, or its launcher died
    launch: bool  # a first start or a relaunch (not a restart)
    first_output: float | None = None
    launched: float | None = None  # a relaunch: when its launcher began (pre-check, agents)


@dataclass(frozen=True)
class Incident:
    attempt: int
    detected: float
    fault: float | None = None
    recovered: float | None = None  # the first progress after the recovery
    restarted: bool = False  # the ladder acted (not: gave up)
    hang: bool = False
    ends_attempt: bool = True  # False: in-process restart or step re-execution
    resumed_step: int | None = None


@dataclass(frozen=True)
class LedgerInput:
    start: float
    end: float
    attempts: list[Attempt]
    incidents: list[Incident] = field(default_factory=list)
    samples: list[tuple[int, int, float]] = field(default_factory=list)  # attempt, step, at
    saves: list[tuple[float, float]] = field(default_factory=list)  # (loop went on, blocked s)
    # memory snapshots, a report each: (its last snapshot returned, their blocking summed)
    snapshots: list[tuple[float, float]] = field(default_factory=list)
    hangs: list[tuple[int, float]] = field(default_factory=list)  # confirmed: attempt, at
    queues: list[tuple[int, float]] = field(default_factory=list)  # waits for nodes: attempt, at
    stops: list[float] = field(default_factory=list)  # a person's stop requested at (STOPPED)
    # a job without step reports: whether it is known to report none (it succeeded so, it
    # committed checkpoints with no step report, or its ranks were found printing without
    # them: NoProgressSignal; review 46 #1: a checkpoint-only job read 0%); only then does an
    # attempt's first output start its training (walk-through 38 #4: a live job loading its
    # data read 92% goodput before its first step; review 45 #1: one that failed, was
    # stopped or lost before it, 99%)
    reports_no_steps: bool = True


@dataclass(frozen=True)
class Segment:
    start: float
    end: float
    cause: str  # PRODUCTIVE, STOPPED or one of CAUSES
    attempt: int | None


@dataclass
class Goodput:
    wall_s: float
    segments: list[Segment]
    steps_productive: int
    steps_wasted: int
    step_seconds: list[tuple[int, int, float]]  # (attempt, step, seconds per step)
    measured_steps: bool  # False: no step reports
    # no step reports from a job known to report none: productive = output seen between
    # faults (False with measured_steps False: none reported yet, all start-up so far)
    output_counts: bool = False

    def seconds(self, cause: str, since: float | None = None) -> float:
        return sum(max(0.0, s.end - max(s.start, since or s.start))
                   for s in self.segments if s.cause == cause)

    @property
    def productive_s(self) -> float:
        return self.seconds(PRODUCTIVE)

    def badput_s(self) -> dict[str, float]:
        return {c: round(self.seconds(c), 3) for c in CAUSES}

    def ratio(self, window_s: float | None = None) -> float | None:
        """Productive / wall time less the time stopped on purpose; over the last
        `window_s` seconds when given."""
        if not self.segments:
            return None
        end = self.segments[-1].end
        since = None if window_s is None else end - window_s
        total = sum(max(0.0, s.end - max(s.start, since or s.start)) for s in self.segments
                    if s.cause != STOPPED)
        return None if total <= 0 else round(self.seconds(PRODUCTIVE, since) / total, 4)

    def ideal_step_s(self) -> float | None:
        return ideal_step_s([(n, d) for _, n, d in self.step_seconds])

    def to_dict(self, max_steps: int = 2000) -> dict[str, Any]:
        return {"wall_s": round(self.wall_s, 3), "productive_s": round(self.productive_s, 3),
                "goodput": self.ratio(), "badput_s": self.badput_s(),
                "stopped_s": round(self.seconds(STOPPED), 3),
                "steps": {"productive": self.steps_productive, "wasted": self.steps_wasted},
                "measured_steps": self.measured_steps, "output_counts": self.output_counts,
                "ideal_step_s": self.ideal_step_s(),
                "segments": [{"attempt": s.attempt, "cause": s.cause, "start": s.start,
                              "end": s.end} for s in self.segments],
                "step_seconds": [list(x) for x in self.step_seconds[-max_steps:]]}


def account(inp: LedgerInput) -> Goodput:
    """Paint the wall time [inp.start, inp.end] with causes; count steps."""
    by_attempt: dict[int, list[tuple[int, float]]] = {}
    for a, step, at in sorted(inp.samples, key=lambda x: x[2]):
        by_attempt.setdefault(a, []).append((step, at))
    spans: list[tuple[float, float, str, int | None]] = []
    order = sorted(inp.attempts, key=lambda a: a.attempt)
    spans += _attempt_spans(inp, order, by_attempt)
    counts = count_steps([a.attempt for a in order], by_attempt,
                         [Resume(i.attempt, i.detected, i.resumed_step, i.ends_attempt)
                          for i in inp.incidents if i.resumed_step is not None])
    spans += counts.wasted_spans
    # a report of snapshots: one span of their sum, ending when the last returned
    spans += [(at - blocked, at, BLOCKING, None) for at, blocked in (*inp.saves, *inp.snapshots)
              if blocked > 0]
    spans += _cut_by_queues(_incident_spans(inp, order, by_attempt), _queue_spans(inp, order))
    spans += _stop_spans(inp, order)
    segments = _paint(inp.start, inp.end, spans)
    return Goodput(max(0.0, inp.end - inp.start), segments, counts.productive, counts.wasted,
                   counts.step_seconds, measured_steps=bool(inp.samples),
                   output_counts=inp.reports_no_steps and not inp.samples)


def _first_sign(a: Attempt, samples: list[tuple[int, float]], inp: LedgerInput
                ) -> float | None:
    """When the attempt's training began: its first step; a job that reports no steps, its
    first output; else (none yet, or none in an attempt of a job that reports them: a
    finished job run again) not at all: start-up or recovery to its end."""
    if samples:
        return samples[0][1]
    return a.first_output if inp.reports_no_steps and not inp.samples else None


def _last_sign(a: Attempt, samples: list[tuple[int, float]], inp: LedgerInput) -> float:
    """When the attempt ended: its end, else (a dead launcher) its last progress or output."""
    if a.end is not None:
        return a.end
    signs = [a.start, *(at for _, at in samples[-1:]), *([a.first_output] if a.first_output
                                                          else [])]
    signs += [i.detected for i in inp.incidents if i.attempt == a.attempt]
    return max(signs)


def _attempt_spans(inp: LedgerInput, order: list[Attempt],
                   by_attempt: dict[int, list[tuple[int, float]]]
                   ) -> list[tuple[float, float, str, int | None]]:
    spans: list[tuple[float, float, str, int | None]] = []
    if order:
        spans.append((inp.start, order[0].start, "startup", None))
    for i, a in enumerate(order):
        samples = by_attempt.get(a.attempt, [])
        end = _last_sign(a, samples, inp) if a.end is not None or i + 1 < len(order) \
            else inp.end
        first = _first_sign(a, samples, inp)
        opening = "startup" if a.launch else "recovery"
        spans.append((a.start, end if first is None else min(first, end), opening, a.attempt))
        if first is not None:
            last = samples[-1][1] if samples else _unmeasured_end(a, end, inp)
            spans.append((first, last, PRODUCTIVE, a.attempt))
        if i + 1 < len(order) and order[i + 1].launch:  # the job was not running
            prev_end, nxt = _last_sign(a, samples, inp), order[i + 1]
            # until the relaunch began; then its pre-check and agents' start are start-up,
            # as the first launch's are
            began = min(max(nxt.launched or nxt.start, prev_end), nxt.start)
            spans.append((prev_end, began, "queued", None))
            spans.append((began, nxt.start, "startup", nxt.attempt))
    return spans


def _unmeasured_end(a: Attempt, end: float, inp: LedgerInput) -> float:
    """No step reports: output was seen, so it ran until its fault (or its end)."""
    faults = [i.fault or i.detected for i in inp.incidents
              if i.attempt == a.attempt and i.ends_attempt]
    return min([end, *faults])


def _incident_spans(inp: LedgerInput, order: list[Attempt],
                    by_attempt: dict[int, list[tuple[int, float]]]
                    ) -> list[tuple[float, float, str, int | None]]:
    spans: list[tuple[float, float, str, int | None]] = []
    nexts = {a.attempt: order[i + 1] for i, a in enumerate(order[:-1])}
    for inc in inp.incidents:
        fault = inc.fault if inc.fault is not None else inc.detected
        samples = by_attempt.get(inc.attempt, [])
        if inc.hang:  # not restarted (left running, or out of budget): until it ended
            a = next((x for x in order if x.attempt == inc.attempt), None)
            until = inc.detected if inc.restarted else inc.recovered or (
                a.end if a is not None and a.end is not None else inp.end)
            spans.append((fault, until, "hang", inc.attempt))
        else:
            spans.append((fault, inc.detected, "detection", inc.attempt))
            if inc.ends_attempt and samples and samples[-1][1] < fault:  # a step cut short
                spans.append((samples[-1][1], fault, "wasted_progress", inc.attempt))
        if not inc.restarted:
            continue
        end = inc.recovered
        if end is None and inc.ends_attempt and inc.attempt in nexts:
            nxt = nexts[inc.attempt]
            end = _first_sign(nxt, by_attempt.get(nxt.attempt, []), inp)
            if end is None and nxt.end is not None:
                end = nxt.end
        spans.append((inc.detected, inp.end if end is None else end, "recovery", inc.attempt))
    hung = {i.attempt for i in inp.incidents if i.hang}
    for attempt, at in inp.hangs:  # a store written before hangs left running had records
        if attempt in hung:
            continue
        samples = by_attempt.get(attempt, [])
        a = next((x for x in order if x.attempt == attempt), None)
        since = samples[-1][1] if samples and samples[-1][1] <= at else (a.start if a else at)
        until = a.end if a is not None and a.end is not None else inp.end
        spans.append((since, until, "hang", attempt))
    return spans


def _queue_spans(inp: LedgerInput, order: list[Attempt]
                 ) -> list[tuple[float, float, str, int | None]]:
    """A reschedule's wait for nodes: from its Queuing event to the next attempt's start
    (the job's end, or now, when none started)."""
    spans: list[tuple[float, float, str, int | None]] = []
    for attempt, at in inp.queues:
        nxt = next((a.start for a in order if a.attempt > attempt and a.start >= at), inp.end)
        spans.append((at, nxt, "queued", attempt))
    return spans


def _stop_spans(inp: LedgerInput, order: list[Attempt]
                ) -> list[tuple[float, float, str, int | None]]:
    """A person's stop: from its request to the next launch's beginning (its pre-check and
    agents' start are start-up), or to the end of the wall time."""
    spans: list[tuple[float, float, str, int | None]] = []
    for at in inp.stops:
        nxt = next((a.launched or a.start for a in order if a.launch and a.start > at),
                   inp.end)
        spans.append((at, min(nxt, inp.end), STOPPED, None))
    return spans


def _cut_by_queues(spans: list[tuple[float, float, str, int | None]],
                   queues: list[tuple[float, float, str, int | None]]
                   ) -> list[tuple[float, float, str, int | None]]:
    """The spans with the queues' time taken out of them (a queue inside a recovery is
    queued, not recovery), and the queues."""
    for q0, q1, _, _ in queues:
        cut: list[tuple[float, float, str, int | None]] = []
        for s0, s1, cause, attempt in spans:
            if s1 <= q0 or s0 >= q1:
                cut.append((s0, s1, cause, attempt))
                continue
            cut += [x for x in ((s0, q0, cause, attempt), (q1, s1, cause, attempt))
                    if x[1] > x[0]]
        spans = cut
    return spans + queues


def _paint(start: float, end: float,
           spans: list[tuple[float, float, str, int | None]]) -> list[Segment]:
    """Each instant of [start, end] gets the highest layer's cause over it ("other" where
    none); neighbours with the same cause and attempt merge.

    The many short checkpoint-blocking spans (one per save) are laid over the few others in
    one linear pass; everything else is swept once with a heap of the open spans."""
    blocking = _merged(sorted((s, e) for s, e, c, _ in spans if c == BLOCKING))
    return _overlay(_sweep(start, end, [x for x in spans if x[2] != BLOCKING]), blocking)


def _sweep(start: float, end: float,
           spans: list[tuple[float, float, str, int | None]]) -> list[Segment]:
    adds: dict[float, list[int]] = {}
    removes: dict[float, list[int]] = {}
    points = {start, end}
    for i, (s, e, _, _) in enumerate(spans):
        s, e = max(s, start), min(e, end)
        if e <= s:
            continue
        adds.setdefault(s, []).append(i)
        removes.setdefault(e, []).append(i)
        points.update((s, e))
    heap: list[tuple[int, int]] = []
    dead: set[int] = set()
    out: list[Segment] = []
    for t0, t1 in pairwise(sorted(points)):
        dead.update(removes.get(t0, ()))
        for i in adds.get(t0, ()):
            heapq.heappush(heap, (-_LAYERS[spans[i][2]], -i))
        while heap and -heap[0][1] in dead:
            heapq.heappop(heap)
        cause, attempt = ("other", None) if not heap else spans[-heap[0][1]][2:]
        _append(out, t0, t1, cause, attempt)
    return out


def _overlay(segments: list[Segment], cuts: list[tuple[float, float]]) -> list[Segment]:
    """Lay the blocking `cuts` (sorted, disjoint) over the segments of lower layers."""
    out: list[Segment] = []
    j = 0
    below = _LAYERS[BLOCKING]
    for seg in segments:
        if _LAYERS[seg.cause] >= below:
            _append(out, seg.start, seg.end, seg.cause, seg.attempt)
            continue
        while j < len(cuts) and cuts[j][1] <= seg.start:
            j += 1
        at, k = seg.start, j
        while k < len(cuts) and cuts[k][0] < seg.end:
            a, b = max(cuts[k][0], seg.start), min(cuts[k][1], seg.end)
            _append(out, at, a, seg.cause, seg.attempt)
            _append(out, a, b, BLOCKING, seg.attempt)
            at = b
            k += 1
        _append(out, at, seg.end, seg.cause, seg.attempt)
    return out


def _append(out: list[Segment], t0: float, t1: float, cause: str, attempt: int | None) -> None:
    if t1 <= t0:
        return
    if out and out[-1].cause == cause and out[-1].attempt == attempt and out[-1].end == t0:
        out[-1] = Segment(out[-1].start, t1, cause, attempt)
    else:
        out.append(Segment(t0, t1, cause, attempt))


def _merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for s, e in intervals:
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        elif e > s:
            out.append((s, e))
    return out
