"""A silent evaluation is not a hang (walk-through 20, finding 2): before a hang is confirmed
the stuck ranks' Python stacks are looked at; a main thread that ran through other functions
since the last look is working, and the confirmation waits, up to the phase allowance."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from trainguard.controller.hang_watch import HangWatch
from trainguard.hang.detector import HangDetector, HangPolicy, HangState
from trainguard.hang.stacks import Frame, RankStack, ThreadStack, moving
from trainguard.protocol import FrameMsg, RankLiveness, StackDump, ThreadMsg

T0 = datetime(2026, 12, 4, tzinfo=timezone.utc)
EVAL = [("matmul", "torch/nn/functional.py", 10), ("forward", "model.py", 40),
        ("evaluate", "train.py", 9), ("<module>", "train.py", 20)]
DATA = [("__next__", "torch/utils/data/dataloader.py", 70), ("evaluate", "train.py", 8),
        ("<module>", "train.py", 20)]


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def stack(frames: list[tuple[str, str, int]], error: str | None = None) -> RankStack:
    return RankStack(0, 100, (ThreadStack(100, "MainThread", False, True, tuple(
        Frame(n, f, line) for n, f, line in frames)),), error)


def test_two_places_in_python_are_motion_and_one_place_every_time_is_not() -> None:
    wait = [("wait", "torch/distributed/distributed_c10d.py", 3000), ("<module>", "train.py", 50)]
    assert moving([stack(EVAL), stack(DATA)])
    assert moving([stack(EVAL), stack([("matmul", "torch/nn/functional.py", 10),
                                       ("forward", "model.py", 41), *EVAL[2:]])])
    assert not moving([stack(wait), stack(wait), stack(wait)])
    assert not moving([stack(EVAL)])
    assert not moving([stack(EVAL), stack([], error="py-spy timed out")])


def steady(det: HangDetector) -> float:
    """A rank that steps every 0.5 s for 10 s (the threshold is the 8 s floor)."""
    det.start_attempt(at(0))
    t = 0.0
    for step in range(1, 21):
        t = step * 0.5
        det.observe([RankLiveness(rank=0, last_step=step, last_progress_at=at(t),
                                  intervals=[0.5] if step > 1 else [])], at(t))
    return t


def silent(det: HangDetector, t: float) -> Any:
    return det.observe([RankLiveness(rank=0, last_step=20, last_progress_at=at(10))], at(t))


def test_a_moving_stack_holds_the_confirmation_off_until_the_phase_allowance_is_spent(
) -> None:
    det = HangDetector(HangPolicy(phase_s=120.0))  # more than life_cap x T (80 s)
    last = steady(det)
    assert silent(det, last + 6).state == HangState.SUSPECTED
    assert silent(det, last + 8.5).state == HangState.CONFIRMED  # nothing else moves
    assert det.stack_moved([0], at(last + 8.5))  # the controller looked: the stack moved
    for t in range(20, 120, 4):  # like a marked phase: no more looks needed
        v = silent(det, last + t)
        assert v.state == HangState.SUSPECTED, t
        assert "Python stack moves" in (v.waiting_for or "")
    assert silent(det, last + 121).state == HangState.CONFIRMED  # the allowance is spent
    assert not det.stack_moved([0], at(last + 121))  # past it: it stays confirmed
    assert silent(det, last + 122).state == HangState.CONFIRMED


def test_a_moving_stack_of_an_earlier_suspicion_counts_no_more() -> None:
    det = HangDetector()
    last = steady(det)
    silent(det, last + 6)
    silent(det, last + 8.5)
    det.stack_moved([0], at(last + 8.5))
    t = last + 9
    det.observe([RankLiveness(rank=0, last_step=21, last_progress_at=at(t))], at(t))  # a step
    assert det.observe([RankLiveness(rank=0, last_step=21, last_progress_at=at(t))],
                       at(t + 6)).state == HangState.SUSPECTED
    assert det.observe([RankLiveness(rank=0, last_step=21, last_progress_at=at(t))],
                       at(t + 8.5)).state == HangState.CONFIRMED


def dump(frames: list[tuple[str, str, int]]) -> StackDump:
    return StackDump(rank=0, pid=100, threads=[ThreadMsg(thread_id=100, name="MainThread",
                     frames=[FrameMsg(name=n, filename=f, line=line) for n, f, line in frames])])


def watch(tmp_path: Path, looks: list[list[tuple[str, str, int]]]
          ) -> tuple[HangWatch, list[str], list[Any]]:
    said: list[str] = []
    moved: list[Any] = []
    w = object.__new__(HangWatch)
    w.rec = SimpleNamespace(  # type: ignore[assignment]
        event=lambda level, reason, message, **kw: said.append(f"{reason.value}: {message}"),
        paths=SimpleNamespace(log_dir=str(tmp_path)), spec=SimpleNamespace(restart_on_hang=True))
    seen = iter(looks)
    w.agent = SimpleNamespace(  # type: ignore[assignment]
        dump_stacks=lambda cmd: [dump(next(seen))])
    w.enabled, w._attempt, w.confirmed, w._ending = True, 0, None, None
    w._state, w._looks, w._working_told, w._looked = HangState.OK, {}, False, 0.0
    states = iter([HangState.SUSPECTED, HangState.CONFIRMED, HangState.SUSPECTED,
                   HangState.CONFIRMED])
    w.detector = SimpleNamespace(  # type: ignore[assignment]
        policy=HangPolicy(), stack_moved=lambda ranks, now: moved.append(ranks) or True,
        observe=lambda liveness, now, ending: SimpleNamespace(
            state=next(states), stuck_ranks=(0,), describe=lambda: "rank 0 stuck",
            last_progress_at=None, idle_s=9.0, threshold_s=8.0, p99_s=None, basis="floor",
            waiting_for=None))
    return w, said, moved


def report() -> Any:
    return SimpleNamespace(at=datetime.now(timezone.utc), liveness=[], progress=None,
                           workers=[])


def test_the_watch_defers_a_confirmation_while_the_stack_moves_and_says_how_to_mark_it(
        tmp_path: Path) -> None:
    w, said, moved = watch(tmp_path, [EVAL, DATA])
    assert w.observe(report()) is None  # suspected: the first look
    assert w.observe(report()) is None  # about to confirm: the second look moved
    assert moved == [[0]]
    assert said[-1].startswith("HangSuspected: not confirmed: the Python stack of rank(s) 0 "
                               "moves")
    assert 'trainguard.phase("eval")' in said[-1]


def test_the_watch_confirms_when_the_looks_find_the_stack_in_place(tmp_path: Path) -> None:
    wait = [("wait", "torch/distributed/distributed_c10d.py", 3000),
            ("<module>", "train.py", 20)]
    w, said, moved = watch(tmp_path, [wait] * 3)  # 2 looks, then the evidence dump
    w.observe(report())
    confirmed = w.observe(report())
    assert moved == []
    assert confirmed is not None and said[-1].startswith("HangConfirmed: hang confirmed")
