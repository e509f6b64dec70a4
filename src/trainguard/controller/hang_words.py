"""What the hang events say while a suspicion waits (controller/hang_watch.py). Pure.

A suspected hang is not confirmed while the job shows work that reports no step: the looks
find a rank working (its Python stack moves, it computes in a numeric library, its data
loader hands over batches), or it shows life (it prints, reads or writes, its accelerator's
load varies). Each is told once a suspicion, with how long it may hold the confirmation off,
and a confirmation that came once the hold ran out says so (walk-through 33 #3: "Every rank
is sleeping ... no progress for 80.1s (threshold 8.0s)" of ranks that printed a line a
second, and nothing said why it had waited)."""

from __future__ import annotations

from trainguard.hang.detector import HangVerdict
from trainguard.records import rank_list

MARK_IT = ("An evaluation or other long work without step lines: mark it with "
           "`with trainguard.phase(\"eval\"):` (docs/hang-detection.md)")


def working(v: HangVerdict, how: dict[int, str], phase_s: float, motion_window_s: float,
            loader_fed_s: float) -> str:
    """The second HangSuspected when the looks found ranks working (`how`: rank -> moves,
    computes or loads)."""
    def of(kind: str) -> str:
        return rank_list(sorted(r for r, h in how.items() if h == kind))
    why = " and ".join(w for w in (
        f"the Python stack of rank(s) {of('moves')} moves" if of("moves") else "",
        f"rank(s) {of('computes')} compute in a numeric library (torch) with their CPU busy"
        if of("computes") else "",
        f"rank(s) {of('loads')} wait in the data loader and get batches from its workers"
        if of("loads") else "") if w)
    return (f"not confirmed: {why}, so the job works at something that reports no step "
            f"({v.describe()}); it is given the phase allowance ({phase_s:g}s without "
            f"progress) while it works, and confirmed once it has sat at one place for "
            f"{motion_window_s:g}s (or its data loader has handed over nothing for "
            f"{loader_fed_s:g}s). {MARK_IT}")


def held(v: HangVerdict, why: str, life_cap: float) -> str:
    """The second HangSuspected when the job shows life (`why`: the detector's words)."""
    cap = v.threshold_s * life_cap
    return (f"not confirmed: {why} ({v.describe()}); that holds the confirmation off up to "
            f"{cap:g}s without progress ({life_cap:g} x the threshold). {MARK_IT}")


def held_then(why: str, life_cap: float) -> str:
    """What a confirmation adds once the life it waited on outlasted its hold."""
    return (f" It was held while {why}, up to {life_cap:g} x the threshold without progress: "
            "output, I/O or an accelerator's load is not progress")
