"""The controller's eye on hangs: feeds the detector, reports, and gathers the evidence.

Each poll's liveness goes to hang.detector.HangDetector. On a suspicion: a `HangSuspected`
Warning ("The system detects that your training job may be suspended"); while suspected,
quick looks at the Python stacks of the stuck ranks outside a marked phase (LOOK_EVERY_S
apart, LOOK_WORKING_S once they were found working, and one more before a confirmation,
which waits until each was looked at MIN_LOOKS times, one look a poll, for at most
MORE_LOOKS_S: a loaded machine's looks are slow and few). A
rank found at two places in Python within MOTION_WINDOW_S, or waiting in its data loader
while its process reads what the loader's workers send (batches arrive: a silent evaluation
over a DataLoader whose main thread waits for each batch), works at something that reports no
step (an evaluation no `trainguard.phase` marks), so the hang waits
(detector.seen_working), with a second `HangSuspected` saying why, up to the phase
allowance. On a confirmation:
every rank's stack is dumped (py-spy, through the node agent) into
`logs/attempt-N/stacks/`, the culprit is named (hang.stacks.name_culprit), the verdict is
written to `logs/attempt-N/stacks/hang.json` (what `trainguard diagnose` reads) and a
`HangConfirmed` Warning carries it all. When progress comes back: `HangCleared`. A rank
found exited or shutting down its interpreter when the stacks are taken means the attempt is
ending, not hung: `HangCleared` says so and the ranks left get the ending allowance.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from trainguard.controller import hang_words
from trainguard.controller.hang_evidence import (
    HangConfirmation,
    culprit_data,
    ending_in,
    hang_fault,
    job_ending,
    rank_stack,
    ranks_leaving,
    stopped_culprit,
    top_frames,
    verdict_data,
    write_json,
)
from trainguard.controller.progress_signal import ProgressSignal
from trainguard.controller.recorder import Recorder
from trainguard.controller.stall import SILENT_AGENT_S, ControllerStall
from trainguard.hang.classify import DATALOADER, describe
from trainguard.hang.detector import HangDetector, HangPolicy, HangState, HangVerdict
from trainguard.hang.stacks import (
    HangCulprit,
    RankStack,
    in_library_compute,
    main_thread,
    moving,
    name_culprit,
)
from trainguard.paths import HANG_FILE, stacks_dir
from trainguard.protocol import AgentAPI, DumpStacks, NodeReport
from trainguard.records import Level, Reason, rank_list, utcnow

log = logging.getLogger(__name__)

SUSPENDED = "The system detects that your training job may be suspended"
LOOK_TIMEOUT_S = 5.0  # a quick look at the stacks (Python frames only)
LOOK_EVERY_S = 0.5  # between the end of a look and the next, while a hang is suspected
LOOK_WORKING_S = 2.0  # ... once the ranks were found working (detector motion_fresh_s: 10 s)
LOOK_GAP_S = 0.3  # before a confirmation, a last look this long after the one before
# a rank is confirmed stuck only once it was seen at one place this many times (a loaded
# machine's slow looks may be 1 or 2 in the suspicion, and two looks at work can land at one
# place); the confirmation waits for them, one look a poll, at most MORE_LOOKS_S
MIN_LOOKS = 4
MORE_LOOKS_S = 10.0
# a rank found at two places within this long works; one found at one place for this long
# (30 looks) is stuck, even right after work that moved (an evaluation, then a deadlock)
MOTION_WINDOW_S = 60.0
# a rank waiting in its data loader is fed while its process read within this long (a
# loader's worker processes hand over each batch through a pipe; the loader itself checks
# its workers every 5 s, MP_STATUS_CHECK_INTERVAL, reading nothing)
LOADER_FED_S = 5.0
# a rank found in a numeric library's compute at every look (a GEMM-bound evaluation: one
# place each time) works while its process tree used this much CPU per second of the looks
# (at least BUSY_SPAN_S of them), on a node without an accelerator (there its load varies)
BUSY_CPU = 0.5
BUSY_SPAN_S = 1.0


def policy_of(rec: Recorder) -> HangPolicy:
    s = rec.spec
    return HangPolicy(fixed_s=s.hang_timeout_s, floor_s=s.hang_floor_s, startup_s=s.hang_startup_s)


class HangWatch:
    def __init__(self, rec: Recorder, agent: AgentAPI,
                 silent: Callable[[], dict[str, float]] | None = None) -> None:
        """`silent`: each node's seconds since its agent was last heard (multi-node)."""
        self.rec, self.agent, self._silent = rec, agent, silent
        self.stall = ControllerStall(rec, silent)  # the controller's own silence
        self.enabled = rec.spec.hang_detection
        self.detector = HangDetector(policy_of(rec))
        self.signal = ProgressSignal(rec)
        self._state = HangState.OK
        self._attempt = 0
        self.confirmed: HangConfirmation | None = None
        self._ending: str | None = None  # seen in the stacks: the attempt is ending
        self._look_ending: str | None = None  # the last look saw a rank exit or shut down
        self._new_suspicion()

    def _new_suspicion(self) -> None:
        """Forget the last suspicion's looks: a new one starts from none."""
        # this suspicion's looks at each rank's stack, with when they were taken (monotonic,
        # and the node's clock at the poll that took them: the reads' samples are timed so)
        self._looks: dict[int, list[tuple[float, datetime, RankStack]]] = {}
        self._looked = 0.0  # when the last look ended (time.monotonic)
        self._working_told = False  # this suspicion's "still working" event was given
        self._held_why: str | None = None  # what life held it off (its event was given)
        self._held_since: float | None = None  # this suspicion's wait for MIN_LOOKS looks
        # each stuck rank's CPU samples in this suspicion: (sampled at, CPU seconds so far)
        self._cpu: dict[int, list[tuple[datetime, float]]] = {}
        self._accel: set[int] = set()  # ranks whose node reports an accelerator's load

    def _look(self, ranks: list[int], at: datetime) -> None:
        """A quick look at the Python stacks of `ranks`, kept (best effort)."""
        out = stacks_dir(Path(self.rec.paths.log_dir), self._attempt) / "looks"
        try:
            dumps = self.agent.dump_stacks(DumpStacks(
                out_dir=str(out), native=False, timeout_s=LOOK_TIMEOUT_S, ranks=ranks))
        except Exception as e:  # never lose the verdict for it
            log.warning("a look at the stacks failed: %s", e)
            dumps = []
        self._looked = now = time.monotonic()
        self._look_ending = ending_in(dumps, {d.rank: rank_stack(d) for d in dumps})
        for d in dumps:
            if d.rank in ranks and not d.error:
                kept = [x for x in self._looks.get(d.rank, []) if now - x[0] <= MOTION_WINDOW_S]
                self._looks[d.rank] = [*kept, (now, at, rank_stack(d))]

    def _note_cpu(self, report: NodeReport) -> None:
        for rl in report.liveness:
            if rl.accel_util is not None:
                self._accel.add(rl.rank)
            if rl.cpu_s is not None and rl.sampled_at is not None:
                kept = [(at, cpu) for at, cpu in self._cpu.get(rl.rank, [])  # the looks' window
                        if (rl.sampled_at - at).total_seconds() <= MOTION_WINDOW_S]
                if not kept or kept[-1][0] != rl.sampled_at:
                    kept.append((rl.sampled_at, rl.cpu_s))
                self._cpu[rl.rank] = kept

    def _busy(self, rank: int, since: datetime) -> bool:
        """Whether the rank's process tree used BUSY_CPU of a CPU from `since` on."""
        got = [(at, cpu) for at, cpu in self._cpu.get(rank, []) if at >= since]
        if len(got) < 2 or rank in self._accel:
            return False
        span = (got[-1][0] - got[0][0]).total_seconds()
        return span >= BUSY_SPAN_S and (got[-1][1] - got[0][1]) / span >= BUSY_CPU

    def _working(self, ranks: list[int], now: datetime) -> dict[int, str]:
        """The ranks found working at something that reports no step, each with how:
        "moves" (found at two places in Python within the last MOTION_WINDOW_S), "computes"
        (found in a numeric library's compute at every look, two at least, with its CPU
        busy since the first: walk-through 33 #2) or "loads"
        (found waiting for a batch in its data loader at the last look and at one before,
        and its process read between two samples taken after that one, the later within
        LOADER_FED_S: batches arrive; the reads of the loader's start do not count)."""
        found: dict[int, str] = {}
        t = time.monotonic()
        for r in ranks:
            looks = [(at, rs) for mono, at, rs in self._looks.get(r, [])
                     if t - mono <= MOTION_WINDOW_S]
            if moving(rs for _, rs in looks):
                found[r] = "moves"
                continue
            if len(looks) >= 2 and all(in_library_compute(rs) for _, rs in looks) \
                    and self._busy(r, looks[0][0]):
                found[r] = "computes"
                continue
            rose = self.detector.reads_rose(r)
            waited = [at for at, rs in looks if _waits_for_data(rs)]
            if rose is not None and waited and _waits_for_data(looks[-1][1]) \
                    and rose[0] >= waited[0] \
                    and (now - rose[1]).total_seconds() <= LOADER_FED_S:
                found[r] = "loads"
        return found

    def _keep_looking(self, v: HangVerdict, report: NodeReport, now: datetime) -> None:
        """A look when one is due, while a hang is suspected; the detector is told of the
        ranks it finds working."""
        ranks = _lookable(v, report)
        wait = LOOK_WORKING_S if self._working_told else LOOK_EVERY_S
        if ranks and time.monotonic() - self._looked >= wait:
            self._look(ranks, now)
            working = self._working(ranks, now)
            if working:
                self.detector.seen_working(working, now)
                self._tell_working(v, working)

    def start_attempt(self, attempt: int, at: datetime) -> None:
        self._attempt, self._state, self.confirmed = attempt, HangState.OK, None
        self._ending = None
        self.detector.start_attempt(at)

    def observe(self, report: NodeReport) -> HangConfirmation | None:
        """The confirmation, the first time a hang is confirmed in this attempt."""
        self.signal.observe(report, self._attempt)  # is there anything to watch by?
        if not self.enabled or self.stall.holds(self._attempt):  # (walk-through 36 #8)
            return None
        now = report.at  # the node's clock, as the liveness times it reports
        leaving = ranks_leaving(report)
        if self._ending is None and leaving is not None:
            self._ending = leaving  # sticky: the rank's teardown goes on until it exits
        ending = job_ending(report) or self._ending
        v = self.detector.observe(report.liveness, now, ending=ending)
        before, self._state = self._state, v.state
        if v.state != HangState.OK and self.confirmed is None:  # none once confirmed (left
            self._note_cpu(report)  # running, its samples would pile up)
        if v.state == HangState.OK and before != HangState.OK:
            self.rec.event(Level.INFO, Reason.HANG_CLEARED,
                           f"not a hang: the attempt is ending ({ending})" if ending else
                           "the job makes progress again; the suspected hang is over",
                           attempt=self._attempt)
            if self.confirmed is not None:  # diagnose must not report a hang that ended
                path = self.confirmed.stacks_dir / HANG_FILE
                with contextlib.suppress(OSError, ValueError):
                    data = json.loads(path.read_text(encoding="utf-8"))
                    write_json(path, {**data, "cleared_at": now.isoformat()})
                self.rec.book.hang_cleared(now)
            self.confirmed = None
            self._new_suspicion()
        elif v.state == HangState.SUSPECTED:
            if before == HangState.OK:
                self.rec.event(Level.WARNING, Reason.HANG_SUSPECTED, self.suspected(v, report),
                               rank=v.stuck_ranks[0] if len(v.stuck_ranks) == 1 else None,
                               attempt=self._attempt, data=verdict_data(v))
                self._new_suspicion()
            self._keep_looking(v, report, now)
            self._tell_held(v)
        elif v.state == HangState.CONFIRMED and before != HangState.CONFIRMED and (
                self._unheard(v, report)[2] or self._deferred(v, report, now)):
            self._state = HangState.SUSPECTED
        elif v.state == HangState.CONFIRMED and before != HangState.CONFIRMED:
            self.confirmed = self._confirm(v, report, now)
            if self.confirmed is not None and not self.rec.spec.restart_on_hang:
                fault = hang_fault(self.confirmed, self.confirmed.confirmed_at,
                                   report.progress, replaced=False)
                self.rec.book.hang_left_running(self._attempt, replace(
                    fault, reason=f"left running (--restart-on-hang is off): {fault.reason}"))
            return self.confirmed
        return None

    def suspected(self, v: HangVerdict, report: NodeReport) -> str:
        """The suspicion, said as what is known: when every stuck rank's node agent has been
        silent, its progress is what nobody heard (a frozen agent's rank trained on, and was
        said to be suspended; walk-through 26); the node's loss decides that case."""
        silent, quiet, _ = self._unheard(v, report)
        if not quiet:
            return f"{SUSPENDED}: {v.describe()}"
        return (f"no progress heard from rank(s) {rank_list(v.stuck_ranks)} for "
                f"{v.idle_s:.1f}s: the agent of {', '.join(quiet)} has been silent for "
                f"{max(silent[n] for n in quiet):.1f}s, so nobody could report it (the ranks may "
                f"be training); a node is lost after {self.rec.spec.node_timeout_s:g}s of "
                "silence")

    def _unheard(self, v: HangVerdict, report: NodeReport
                 ) -> tuple[dict[str, float], list[str], bool]:
        """Each node's silence; the stuck ranks' nodes when every one's agent is silent (their
        progress is what nobody heard); whether any is: no hang is confirmed then, their loss
        (the node timeout, a full disruption's wait) decides (walk-through 36 #12: confirmed
        80 s into a controller-side outage; review 40 #6: one node heard again before its
        report's progress was merged)."""
        silent = self._silent() if self._silent is not None else {}
        node_of = {w.rank: w.node for w in report.workers}
        quiet = sorted({n for r in v.stuck_ranks if (n := node_of.get(r)) is not None})
        unheard = [n for n in quiet if silent.get(n, 0.0) >= SILENT_AGENT_S]
        return silent, quiet if len(unheard) == len(quiet) else [], bool(unheard)

    def _deferred(self, v: HangVerdict, report: NodeReport, now: datetime) -> bool:
        """Whether a hang about to be confirmed waits: a stuck rank outside a marked phase
        was found working (`_working`; one more look first, when none was yet), and the
        detector's allowance for that is not spent; or a rank was seen fewer
        than MIN_LOOKS times yet (but at least once: looks work here), for at most
        MORE_LOOKS_S (one look at each poll)."""
        ranks = _lookable(v, report)
        if not ranks:
            return False
        if not self._working(ranks, now):
            time.sleep(max(0.0, LOOK_GAP_S - (time.monotonic() - self._looked)))
            self._look(ranks, now)
        working = self._working(ranks, now)
        if working:
            if not self.detector.seen_working(working, now):
                return False  # past the allowance of work that reports no step
            self._tell_working(v, working)
            return True
        if self._held_since is None:
            self._held_since = time.monotonic()
        # not when no look succeeds here (py-spy missing or refused: more would not), nor
        # when the last one saw the attempt ending (the confirmation's dump says so)
        if any(0 < len(self._looks.get(r, [])) < MIN_LOOKS for r in ranks) and \
                self._look_ending is None and \
                time.monotonic() - self._held_since < MORE_LOOKS_S:
            self.detector.hold()
            return True
        return False

    def _tell_working(self, v: HangVerdict, working: dict[int, str]) -> None:
        """The second HangSuspected of a suspicion: why it is not confirmed (once)."""
        if self._working_told:
            return
        self._working_told = True
        ranks = sorted(working)
        self.rec.event(
            Level.WARNING, Reason.HANG_SUSPECTED, hang_words.working(
                v, working, self.detector.policy.phase_s, MOTION_WINDOW_S, LOADER_FED_S),
            rank=ranks[0] if len(ranks) == 1 else None, attempt=self._attempt,
            data={**verdict_data(v), "working_ranks": ranks,
                  "working": {str(r): how for r, how in working.items()}})

    def _tell_held(self, v: HangVerdict) -> None:
        """The second HangSuspected when the job's life holds the confirmation off (once)."""
        if v.waiting_for is None or self._held_why is not None or self._working_told:
            return
        self._held_why = v.waiting_for
        self.rec.event(Level.WARNING, Reason.HANG_SUSPECTED, hang_words.held(
            v, v.waiting_for, self.detector.policy.life_cap), attempt=self._attempt,
            data={**verdict_data(v), "waiting_for": v.waiting_for})

    def _confirm(self, v: HangVerdict, report: NodeReport, now: datetime
                 ) -> HangConfirmation | None:
        """The confirmation with its evidence; None when the stacks show the attempt ending."""
        out = stacks_dir(Path(self.rec.paths.log_dir), self._attempt)
        try:
            dumps = self.agent.dump_stacks(DumpStacks(out_dir=str(out)))
        except Exception as e:  # evidence is best effort: never lose the verdict for it
            log.warning("stack dumps failed: %s", e)
            dumps = []
        stacks = {d.rank: rank_stack(d) for d in dumps}
        ending = ending_in(dumps, stacks)
        if ending is not None:  # under load a rank's exit can outlast the hang timeout
            self._ending, self._state = ending, HangState.OK
            self.rec.event(Level.INFO, Reason.HANG_CLEARED,
                           f"not a hang: {ending} when the stacks were taken; the attempt is "
                           f"ending (the ranks left get the ending allowance)",
                           attempt=self._attempt)
            return None
        steps = {rl.rank: rl.last_step for rl in report.liveness}
        try:
            culprit = name_culprit(stacks, steps)
        except Exception as e:  # a bug there must not take the launcher down
            log.exception("naming the culprit failed")
            culprit = HangCulprit(None, f"the culprit could not be named ({e})", {}, None, 0.0)
        culprit = stopped_culprit(culprit, dumps)
        files = [f for d in dumps for f in d.files]
        top = {str(r): top_frames(rs) for r, rs in stacks.items()}
        data = {**verdict_data(v), "culprit": culprit_data(culprit), "stacks": top,
                "stack_files": files,
                "stack_errors": {str(d.rank): d.error for d in dumps if d.error},
                "confirmed_at": now.isoformat()}
        write_json(out / HANG_FILE, {**data, "attempt": self._attempt})
        who = f"rank {culprit.rank}" if culprit.rank is not None else "no single rank"
        took = (utcnow() - now).total_seconds()  # the event comes once the stacks are in
        self.rec.event(Level.WARNING, Reason.HANG_CONFIRMED,
                       f"hang confirmed: {v.describe()}. Culprit: {who}: "
                       f"{culprit.reason.rstrip('.')}. Stacks of every rank: {out} (taken in "
                       f"{took:.1f}s after the hang was confirmed at "
                       f"{now.astimezone().strftime('%H:%M:%S')})"
                       + (hang_words.held_then(self._held_why, self.detector.policy.life_cap)
                          if self._held_why and v.idle_s > v.threshold_s *
                          self.detector.policy.life_cap else "")
                       + ("" if self.rec.spec.restart_on_hang else ". Left running: "
                          "--restart-on-hang is off (with it, or the multi-node and llm "
                          "presets, the hung ranks are restarted); `trainguard stop` ends it"),
                       rank=culprit.rank,
                       attempt=self._attempt, data=data)
        return HangConfirmation(v, culprit, now, out)



def _waits_for_data(rs: RankStack) -> bool:
    """Whether a rank's main thread is in its data loader, past the loader's start
    (forking its workers reads)."""
    what, where = describe(main_thread(rs))
    return what == DATALOADER and not where.endswith(("__init__", "__iter__", "_get_iterator"))


def _lookable(v: HangVerdict, report: NodeReport) -> list[int]:
    """The stuck ranks whose stacks are looked at: not those in a marked phase (its own
    timeout decides)."""
    in_phase = {rl.rank for rl in report.liveness if rl.phase is not None}
    return [r for r in v.stuck_ranks if r not in in_phase]
