"""Every rank's stack (py-spy JSON) -> what each rank does -> the rank that hangs the rest. Pure.

`classify` reads a main thread's frames (innermost first) and says what it waits for; the
native frames (`py-spy dump --native`) make the difference between a rank that sleeps, one
blocked in `flock` and one in a collective's wait. `name_culprit` compares the ranks.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from trainguard.hang.classify import (
    BLOCKED,
    COLLECTIVE,
    COMPUTE,
    DATALOADER,
    ERROR,
    GPU,
    IO,
    LOCK,
    PHRASES,
    SLEEP,
    UNKNOWN,
    WAITING,
    Frame,
    ThreadStack,
    classify,
    culprit_frame,
    describe,
)

__all__ = ["BLOCKED", "COLLECTIVE", "COMPUTE", "DATALOADER", "ERROR", "GPU", "IO", "LOCK",
           "SLEEP", "UNKNOWN", "Frame", "HangCulprit", "RankStack", "ThreadStack", "call_path",
           "classify", "culprit_frame", "describe", "in_library_compute", "main_thread", "moving",
           "name_culprit",
           "parse_pyspy_json", "render_text"]


@dataclass(frozen=True)
class RankStack:
    rank: int
    pid: int
    threads: tuple[ThreadStack, ...]
    error: str | None = None


@dataclass(frozen=True)
class HangCulprit:
    rank: int | None
    reason: str
    by_rank: dict[int, str]  # rank -> classification (`error`: its stack could not be taken)
    frame: str | None  # the culprit's innermost user-code frame: "train.py:88 in step"
    confidence: float  # how sure the verdict is, the named rank or "no single culprit"


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _parse_frame(f: dict[str, Any]) -> Frame:
    module = f.get("module") if isinstance(f.get("module"), str) else None
    filename = f.get("filename") or f.get("short_filename") or module or ""
    return Frame(str(f.get("name") or "?"), str(filename), _int(f.get("line")) or 0, module,
                 module is not None)


def parse_pyspy_json(text: str) -> list[ThreadStack]:
    """The threads of one `py-spy dump --pid P --json [--native]` output, in py-spy's order."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"py-spy output is not JSON ({e.msg} at line {e.lineno}): "
                         f"{text.strip()[:120]!r}") from None
    if isinstance(data, dict) and "frames" in data:
        data = [data]
    if not isinstance(data, list):
        raise ValueError(f"py-spy JSON is not a list of threads but a {type(data).__name__}")
    threads = []
    for t in data:
        if not isinstance(t, dict):
            continue
        os_tid = _int(t.get("os_thread_id"))
        active, gil = t.get("active"), t.get("owns_gil")
        name, frames = t.get("thread_name"), t.get("frames")
        threads.append(ThreadStack(
            _int(t.get("thread_id")) or os_tid or 0, name if isinstance(name, str) else None,
            (not active) if isinstance(active, bool) else None,
            gil if isinstance(gil, bool) else None,
            tuple(_parse_frame(f) for f in (frames if isinstance(frames, list) else ())
                  if isinstance(f, dict)),
            os_tid))
    return threads


def call_path(rank_stack: RankStack) -> tuple[tuple[str, str], ...] | None:
    """The Python functions a rank's main thread is in, innermost first, as (file,
    function); None when its stack could not be taken."""
    t = main_thread(rank_stack)
    if rank_stack.error is not None or t is None:
        return None
    return tuple((f.filename, f.name) for f in t.frames if not f.native)


def moving(samples: Iterable[RankStack]) -> bool:
    """Whether a rank's main thread was found in two call paths among samples of its stack:
    it runs code that goes in and out of functions (an evaluation, a long data pass), where
    a rank stuck in a collective, a lock, a sleep or a loop of one function is found in one
    path every time (at whichever line of it: CPython reports a busy loop's `while` line
    and its body's in turn)."""
    paths = {p for s in samples if (p := call_path(s))}
    return len(paths) > 1


# numeric libraries whose Python frames call straight into compute kernels (a GEMM-bound
# forward sits in `torch/nn/modules/linear.py` at every look); not their collectives, data
# loaders or device syncs, which wait
_COMPUTE_LIBS = ("torch/", "numpy/", "scipy/", "jax/", "jaxlib/", "tensorflow/")
_WAITING_LIBS = ("torch/distributed/", "torch/utils/data/", "torch/cuda/", "jax/_src/dist")


def in_library_compute(rank_stack: RankStack) -> bool:
    """Whether a rank's main thread runs a numeric library's compute: active (not idle),
    classified compute, its innermost Python frame in torch (not torch.distributed, its data
    loader or CUDA) or another numeric library: a silent evaluation whose time goes to its
    kernels is found at one place at every look (walk-through 33 #2). A user's own busy loop
    (its innermost frame the user's code) is not."""
    t = main_thread(rank_stack)
    if rank_stack.error is not None or t is None or t.idle is not False \
            or classify(t) != COMPUTE:
        return False
    inner = next((f for f in t.frames if not f.native), None)
    return inner is not None and not inner.is_user_code and \
        inner.short_filename.startswith(_COMPUTE_LIBS) and \
        not inner.short_filename.startswith(_WAITING_LIBS)


def main_thread(rank_stack: RankStack) -> ThreadStack | None:
    """The process's main thread: os thread id == pid, else "MainThread", else the one running
    a `<module>`, else the first."""
    threads = rank_stack.threads
    for t in threads:
        if t.os_thread_id is not None and t.os_thread_id == rank_stack.pid:
            return t
    for t in threads:
        if t.name == "MainThread":
            return t
    for t in threads:
        if any(f.name == "<module>" for f in t.frames if not f.native):
            return t
    return threads[0] if threads else None


@dataclass(frozen=True)
class _State:
    kind: str
    detail: str
    frame: str | None

    def text(self, plural: bool = False) -> str:
        phrase = PHRASES[self.kind][1 if plural else 0]
        inner = ", ".join(x for x in (self.detail, f"at {self.frame}" if self.frame else "")
                          if x)
        return f"{phrase} ({inner})" if inner else phrase


def _state(rs: RankStack) -> _State:
    if rs.error:
        return _State(ERROR, rs.error, None)
    t = main_thread(rs)
    kind, detail = describe(t)
    return _State(kind, detail, culprit_frame(t))


def _ranks(rs: list[int]) -> str:
    return (f"rank {rs[0]}" if len(rs) == 1
            else "ranks " + ", ".join(str(r) for r in sorted(rs)))


BEHIND_MIN_STEPS = 2  # progress reports are throttled: a lag of one step is noise


def _behind(steps: dict[int, int]) -> list[int]:
    """The ranks at the lowest last step, when the ranks' last steps differ by more than
    a throttled progress report can explain."""
    if not steps or max(steps.values()) - min(steps.values()) < BEHIND_MIN_STEPS:
        return []
    low = min(steps.values())
    return sorted(r for r, s in steps.items() if s == low)


def _group(states: dict[int, _State], ranks: list[int], by_detail: bool = False) -> str:
    """`rank 3 is sleeping (...); ranks 1, 2 are blocked on a lock (...)`."""
    groups: dict[tuple[str, str], list[int]] = {}
    for r in sorted(ranks):
        groups.setdefault((states[r].kind, states[r].detail if by_detail else ""), []).append(r)
    parts = []
    for rs in groups.values():
        s = states[rs[0]]
        shown = s if len(rs) == 1 else _State(s.kind, s.detail, None)
        parts.append(f"{_ranks(rs)} {shown.text(len(rs) > 1)}")
    return "; ".join(parts)


def name_culprit(stacks: dict[int, RankStack], last_steps: dict[int, int | None]
                 ) -> HangCulprit:
    """The rank that hangs the others, from every rank's main-thread stack and last step.

    1. Ranks waiting in a collective (or on the GPU stream a NCCL collective is queued on)
       are victims. When some ranks wait and others do not, the culprit is among those that
       do not (stuck in the data loader, sleeping, spinning in a loop, blocked on a lock).
    2. Last steps: when they differ, the ranks at the lowest step are suspects; among the
       candidates of rule 1 they are preferred, and when every rank waits in a collective
       the rank behind is the culprit.
    3. Every rank waits in a collective and none is behind: a rank calling a different
       collective than the rest is the culprit; a rank whose stack could not be taken is
       the suspect; else there is no single culprit (rank None).
    4. No rank waits: if every rank is in the same state (all blocked in one file lock),
       there is no single culprit (rank None, the common frame); else the ranks outside
       the majority's state are the candidates.
       A job of one rank (one stack taken) has that rank as its culprit, whatever it does.
    5. Ranks whose stack could not be taken are `error` in by_rank and named in the reason.
    Ties go to the lowest rank. `confidence` is how sure the verdict is.
    """
    states = {r: _state(rs) for r, rs in sorted(stacks.items())}
    by_rank = {r: s.kind for r, s in states.items()}
    failed = [r for r, s in states.items() if s.kind == ERROR]
    seen = [r for r in states if r not in failed]
    steps = {r: s for r, s in last_steps.items() if s is not None and r in states}
    behind = _behind(steps)
    note = "".join(f" The stack of rank {r} could not be taken: {states[r].detail}."
                   for r in failed)

    def verdict(rank: int | None, reason: str, conf: float, frame: str | None = None
                ) -> HangCulprit:
        if rank is not None:
            frame = states[rank].frame
            if rank in behind:
                ahead = max(steps.values())
                reason += f" Its last step is {steps[rank]}; the others reached {ahead}."
                conf = min(0.95, conf + 0.05)
        return HangCulprit(rank, reason + note, by_rank, frame, round(conf, 2))

    if not states:
        return verdict(None, "No rank's stack was taken.", 0.0)
    if not seen:
        if behind:
            return verdict(behind[0], f"{_ranks(behind).capitalize()} fell behind;"
                           " no rank's stack could be taken.", 0.3)
        return verdict(None, "No rank's stack could be taken.", 0.0)
    waiting = [r for r in seen if states[r].kind in WAITING]
    if len(states) == 1:  # a job of one rank: that rank hangs, whatever it is doing
        only = seen[0]
        return verdict(only, f"Rank {only}, the only rank, {states[only].text()}.",
                       0.5 if waiting else 0.9)
    others = [r for r in seen if r not in waiting]
    if waiting and others:
        narrowed = [r for r in others if r in behind] or others
        rank = narrowed[0]
        conf = 0.9 if len(others) == 1 else 0.6 if len(narrowed) == 1 else 0.5
        if len(others) > len(waiting):
            conf -= 0.2
        why = f"{_group(states, others)} while {_group(states, waiting, by_detail=True)}."
        if len(others) > 1:
            why += f" Rank {rank} is named: the " + (
                "lowest of those behind." if rank in behind else "lowest rank.")
        return verdict(rank, why[0].upper() + why[1:], conf)
    if waiting:  # every inspected rank waits
        groups = Counter((states[r].kind, states[r].detail) for r in waiting)
        if len(groups) > 1:
            rare = min(groups, key=lambda g: (groups[g], min(
                r for r in waiting if (states[r].kind, states[r].detail) == g)))
            odd = [r for r in waiting if (states[r].kind, states[r].detail) == rare]
            rank = ([r for r in odd if r in behind] or odd)[0]
            return verdict(rank, "The ranks wait in different collectives: "
                           f"{_group(states, waiting, by_detail=True)}.", 0.6)
        kind, detail = next(iter(groups))
        every = "Every rank" if not failed else "Every rank inspected"
        common = f"{every} {PHRASES[kind][0]}" + (f" ({detail})" if detail else "")
        if behind:
            return verdict(behind[0], f"{common}, but {_ranks(behind)} fell behind.", 0.5)
        if failed:
            return verdict(failed[0], f"{common}; rank {failed[0]}, whose stack could not be "
                           "taken, is the suspect.", 0.4)
        return verdict(None, f"{common} at the same step: no rank here is missing from it; "
                       "look for a peer on another node, or a network or device fault.", 0.3,
                       states[waiting[0]].frame)
    kinds = Counter(states[r].kind for r in seen)
    if len(kinds) == 1:
        first = states[seen[0]]
        lead = "Every rank" if not failed else "Every rank inspected"
        return verdict(None, f"{lead} {first.text()}: there is no single culprit.", 0.7,
                       first.frame)
    (top, n), (_, n2) = kinds.most_common(2)
    if n > n2:
        odd = [r for r in seen if states[r].kind != top]
        rank = ([r for r in odd if r in behind] or odd)[0]
        majority = [r for r in seen if states[r].kind == top]
        return verdict(rank, f"No rank waits in a collective; {_group(states, odd)} while "
                       f"{_group(states, majority)}.", 0.5)
    if behind:
        return verdict(behind[0], f"No rank waits in a collective ({_group(states, seen)}); "
                       f"{_ranks(behind)} fell behind.", 0.4)
    return verdict(None, f"No rank waits in a collective and no state stands out: "
                   f"{_group(states, seen)}.", 0.2)


def render_text(rank_stack: RankStack) -> str:
    """A readable dump in py-spy's text layout, to save next to the JSON."""
    head = f"Rank {rank_stack.rank}, process {rank_stack.pid}"
    if rank_stack.error:
        return f"{head}: no stack: {rank_stack.error}\n"
    lines = [head]
    for t in rank_stack.threads:
        status = {True: "idle", False: "active", None: "?"}[t.idle] + ("+gil" if t.owns_gil
                                                                       else "")
        tid = t.os_thread_id if t.os_thread_id is not None else f"{t.thread_id:#x}"
        lines.append(f"Thread {tid} ({status})" + (f': "{t.name}"' if t.name else ""))
        for f in t.frames:
            at = f"{f.short_filename}:{f.line}" if f.line else f.short_filename
            lines.append(f"    {f.name} ({at})")
    return "\n".join(lines) + "\n"
