"""What a hang's evidence says: the attempt ending rather than hung (a rank exited, saving on
its way out, shutting its interpreter down), a stopped rank as the culprit, and the data a
`HangSuspected`/`HangConfirmed` event and `hang.json` carry, and a confirmed hang's record
(HangConfirmation, hang_fault). Pure but for `write_json`.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from trainguard.controller.faults import Fault, task_of
from trainguard.hang.classify import STOPPED, finalizing
from trainguard.hang.detector import HangVerdict
from trainguard.hang.stacks import Frame, HangCulprit, RankStack, ThreadStack, main_thread
from trainguard.protocol import NodeReport, Progress, StackDump
from trainguard.records import FaultScenario, rank_list
from trainguard.states import WorkerState
from trainguard.worker.contract import EXIT_SAVE_PHASE, EXITING_PHASE

log = logging.getLogger(__name__)


def stopped_culprit(culprit: HangCulprit, dumps: list[StackDump]) -> HangCulprit:
    """A rank whose process is stopped (state T) is the culprit, whatever its stack shows:
    it runs nothing until it gets SIGCONT (the others wait for it)."""
    stopped = sorted(d.rank for d in dumps if d.stopped)
    if not stopped:
        return culprit
    pids = " ".join(str(d.pid) for d in sorted(dumps, key=lambda d: d.rank)
                    if d.stopped and d.pid is not None) or "PID"
    who = f"Rank {stopped[0]}'s process is" if len(stopped) == 1 else \
        f"The processes of ranks {rank_list(stopped)} are"
    rank = stopped[0] if len(stopped) == 1 else None
    return replace(culprit, rank=rank, frame=culprit.frame if culprit.rank == rank else None,
                   reason=f"{who} stopped (state T: SIGSTOP, Ctrl-Z or a debugger): nothing "
                          f"runs until SIGCONT ({WAKE.format(pids=pids)})",
                   by_rank={**culprit.by_rank, **{r: STOPPED for r in stopped}},
                   confidence=max(culprit.confidence, 0.9))


WAKE = "`kill -CONT {pids}`"  # what wakes a stopped rank, in its culprit's text
_WAKE = re.compile(r"`kill -CONT ([\d ]+)`")


def woken_text(reason: str) -> str:
    """A stopped rank's culprit text once a rung replaced its processes: their pids as they
    were, no longer the command to wake them (walk-through 40 #9: recovery and report still
    advised `kill -CONT 23723` after that pid was killed and replaced)."""
    return _WAKE.sub(lambda m: f"pid {m.group(1)} at the confirmation", reason)


def job_ending(report: NodeReport) -> str | None:
    """Why the attempt is ending, if it is: a rank exited 0, so the ranks left are
    finishing or tearing down (never confirmed hung within the ending allowance). A rank
    that exited is not in the liveness at all."""
    done = [w.rank for w in report.workers if w.state == WorkerState.SUCCEEDED]
    return f"rank(s) {rank_list(done)} exited 0" if done else ranks_leaving(report)


def ranks_leaving(report: NodeReport) -> str | None:
    """Ranks in a phase that only comes on the way out (the attempt ends with them)."""
    # a rank saving its last step on its way out (an error, or a stop): its peers wait in a
    # collective for it until it exits and the launcher acts
    leaving = [rl.rank for rl in report.liveness if rl.phase == EXIT_SAVE_PHASE]
    if leaving:
        return f"rank(s) {rank_list(leaving)} saving a checkpoint on the way out"
    # a rank whose script returned or raised: its interpreter tears down (torch: seconds)
    exiting = [rl.rank for rl in report.liveness if rl.phase == EXITING_PHASE]
    return f"rank(s) {rank_list(exiting)} exiting their interpreter" if exiting else None


def ending_in(dumps: list[StackDump], stacks: dict[int, RankStack]) -> str | None:
    """Why the stacks show the attempt ending, if they do: a rank's process had ended (its
    exit not reaped yet) or a rank's interpreter is shutting down."""
    gone = sorted(d.rank for d in dumps if d.exited)
    closing = sorted(r for r, rs in stacks.items() if r not in gone
                     and finalizing(main_thread(rs)))
    why = [f"rank(s) {rank_list(ranks)} {what}" for ranks, what in (
        (gone, "had exited"), (closing, "were shutting down their interpreter")) if ranks]
    return " and ".join(why) or None


def top_frames(rs: RankStack, n: int = 8) -> list[str]:
    """The innermost frames of a rank's main thread, for the event."""
    t = main_thread(rs)
    frames = t.frames[:n] if t is not None else ()
    return [f"{f.name} ({f.filename.rsplit('/', 1)[-1]}:{f.line})" for f in frames]


def verdict_data(v: HangVerdict) -> dict[str, Any]:
    return {"state": v.state.value, "stuck_ranks": list(v.stuck_ranks),
            "last_progress_at": v.last_progress_at.isoformat() if v.last_progress_at else None,
            "idle_s": round(v.idle_s, 3), "threshold_s": round(v.threshold_s, 3),
            "p99_step_s": None if v.p99_s is None else round(v.p99_s, 4), "basis": v.basis,
            "waiting_for": v.waiting_for}


def culprit_data(c: HangCulprit) -> dict[str, Any]:
    return {"rank": c.rank, "reason": c.reason, "frame": c.frame,
            "by_rank": {str(r): what for r, what in c.by_rank.items()},
            "confidence": c.confidence}


def rank_stack(d: StackDump) -> RankStack:
    return RankStack(d.rank, d.pid or 0, tuple(
        ThreadStack(t.thread_id, t.name, t.idle, t.owns_gil, tuple(
            Frame(f.name, f.filename, f.line or 0, None, f.native) for f in t.frames))
        for t in d.threads), d.error)


def write_json(path: Path, data: dict[str, Any]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2, default=str), encoding="utf-8")
    except OSError as e:
        log.warning("cannot write %s: %s", path, e)


@dataclass(frozen=True)
class HangConfirmation:
    verdict: HangVerdict
    culprit: HangCulprit
    confirmed_at: datetime
    stacks_dir: Path


def hang_fault(hang: HangConfirmation, stopped: datetime, progress: Progress,
               replaced: bool = True) -> Fault:
    """What the incident's records say of a confirmed hang (`stopped`: when its ranks were
    stopped; the confirmation itself for a hang left running, whose ranks are not
    `replaced`)."""
    reason = woken_text(hang.culprit.reason) if replaced else hang.culprit.reason
    return Fault(FaultScenario.JOB_HANGED, reason, f"hang: {reason}",
                 task_of(hang.culprit.rank), hang.verdict.last_progress_at or hang.confirmed_at,
                 hang.confirmed_at, stopped, progress, "nccl_timeout_or_hang")
