"""A silent evaluation is not a hang (walk-through 20, finding 2): before a hang is confirmed
the stuck ranks' Python stacks are looked at; a main thread that ran through other functions
since the last look is working, and the confirmation waits, up to the phase allowance."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tests.unit.helpers import NO_STEPS, fake_hang_watch
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


def test_two_call_paths_are_motion_and_one_path_every_time_is_not() -> None:
    wait = [("wait", "torch/distributed/distributed_c10d.py", 3000), ("<module>", "train.py", 50)]
    spin = [("_spin", "faults.py", 232), ("inject", "faults.py", 194), ("<module>", "t.py", 9)]
    assert moving([stack(EVAL), stack(DATA)])
    assert not moving([stack(wait), stack(wait), stack(wait)])
    # a busy loop: py-spy finds it at its `while` line and at its body's, in one function
    assert not moving([stack(spin), stack([("_spin", "faults.py", 233), *spin[1:]])])
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
    assert det.seen_working([0], at(last + 8.5))  # the controller looked: the stack moved
    for t in range(10, 119, 2):  # an evaluation: the looks keep finding it at work
        det.seen_working([0], at(last + t))
        v = silent(det, last + t + 1)
        assert v.state == HangState.SUSPECTED, t
        assert "works at something that reports no step" in (v.waiting_for or "")
    assert silent(det, last + 121).state == HangState.CONFIRMED  # the allowance is spent
    assert not det.seen_working([0], at(last + 121))  # past it: it stays confirmed
    assert silent(det, last + 122).state == HangState.CONFIRMED


def test_a_stack_that_stops_moving_is_confirmed_once_the_motion_is_stale() -> None:
    det = HangDetector()
    last = steady(det)
    silent(det, last + 6)
    silent(det, last + 8.5)
    assert det.seen_working([0], at(last + 8.5))
    assert silent(det, last + 8.5 + 9).state == HangState.SUSPECTED  # within motion_fresh_s
    assert silent(det, last + 8.5 + 11).state == HangState.CONFIRMED  # 10 s: no look moved


def test_a_rank_in_a_marked_phase_keeps_its_phases_own_timeout() -> None:
    det = HangDetector()
    det.start_attempt(at(0))
    for step in range(1, 21):
        det.observe([RankLiveness(rank=0, last_step=step, last_progress_at=at(step * 0.5),
                                  intervals=[0.5] if step > 1 else [])], at(step * 0.5))

    def in_eval(t: float) -> Any:
        return det.observe([RankLiveness(rank=0, last_step=20, last_progress_at=at(10),
                                         phase="eval", phase_since=at(10),
                                         phase_timeout_s=30.0)], at(t))
    assert in_eval(31).state == HangState.SUSPECTED
    assert in_eval(41).state == HangState.CONFIRMED  # 31 s in the phase: its timeout
    assert not det.seen_working([0], at(41))  # moving or not: the phase's timeout decides
    assert in_eval(42).state == HangState.CONFIRMED


def _steady_pair(det: HangDetector) -> None:
    det.start_attempt(at(0))
    for step in range(1, 21):
        det.observe([RankLiveness(rank=r, last_step=step, last_progress_at=at(step * 0.5),
                                  intervals=[0.5] if step > 1 else []) for r in (0, 1)],
                    at(step * 0.5))


def test_ranks_waiting_for_a_rank_in_a_marked_phase_get_its_allowance() -> None:
    """Walk-through 33 #1: rank 0 evaluates inside `trainguard.phase("eval")`, rank 1 waits
    for it in a barrier: rank 1 was judged against T (8 s) and the healthy job restarted."""
    det = HangDetector()
    _steady_pair(det)

    def evaluating(t: float) -> Any:
        return det.observe([RankLiveness(rank=0, last_step=20, last_progress_at=at(10),
                                         phase="eval", phase_since=at(10.2),
                                         phase_timeout_s=30.0),
                            RankLiveness(rank=1, last_step=20, last_progress_at=at(10))], at(t))
    for t in (15, 20, 25, 30):
        v = evaluating(t)
        assert v.state == HangState.OK, (t, v)
    assert "rank 0's phase 'eval' allowance 30s" in evaluating(31).basis  # suspected at 2/3

    def after(t: float) -> Any:  # the phase ended at 35; rank 0 stepped then, rank 1 not yet
        return det.observe([RankLiveness(rank=0, last_step=21, last_progress_at=at(35)),
                            RankLiveness(rank=1, last_step=20, last_progress_at=at(10))], at(t))
    # review of walk-through 33 #1: rank 1 counted from its own last step (10 s) again, so it
    # was suspected and confirmed a second after the phase ended; it counts from the end
    for t in (35, 36, 37, 40):
        assert after(t).state == HangState.OK, t
    assert after(41).state == HangState.SUSPECTED  # it never moves: 2/3 of T after the end
    assert after(44).state == HangState.CONFIRMED  # and T after it


def test_a_rank_outside_a_phase_that_outlives_the_phases_allowance_is_confirmed() -> None:
    det = HangDetector()
    _steady_pair(det)
    for t, want in ((31, HangState.SUSPECTED), (41, HangState.CONFIRMED)):  # its own timeout
        assert det.observe([RankLiveness(rank=0, last_step=20, last_progress_at=at(10),
                                         phase="eval", phase_since=at(10.2),
                                         phase_timeout_s=30.0),
                            RankLiveness(rank=1, last_step=20, last_progress_at=at(10))],
                           at(t)).state == want


def test_a_moving_stack_of_an_earlier_suspicion_counts_no_more() -> None:
    det = HangDetector()
    last = steady(det)
    silent(det, last + 6)
    silent(det, last + 8.5)
    det.seen_working([0], at(last + 8.5))
    t = last + 9
    det.observe([RankLiveness(rank=0, last_step=21, last_progress_at=at(t))], at(t))  # a step
    assert det.observe([RankLiveness(rank=0, last_step=21, last_progress_at=at(t))],
                       at(t + 6)).state == HangState.SUSPECTED
    assert det.observe([RankLiveness(rank=0, last_step=21, last_progress_at=at(t))],
                       at(t + 8.5)).state == HangState.CONFIRMED


def dump(frames: list[tuple[str, str, int]]) -> StackDump:
    return StackDump(rank=0, pid=100, threads=[ThreadMsg(thread_id=100, name="MainThread",
                     frames=[FrameMsg(name=n, filename=f, line=line) for n, f, line in frames])])


def watch(tmp_path: Path, looks: list[Any], states: list[HangState] | None = None
          ) -> tuple[HangWatch, list[str], list[Any]]:
    """`looks`: each look's frames (or a StackDump, a failed look); `states`: the fake
    detector's verdicts in turn. The held confirmations are counted in `w.held`."""
    said: list[str] = []
    moved: list[Any] = []
    seen = iter(looks)
    asked: list[Any] = []
    held: list[int] = []

    def dumps(cmd: Any) -> list[StackDump]:
        asked.append(cmd)
        d = next(seen)
        return [d if isinstance(d, StackDump) else dump(d)]

    w = fake_hang_watch(states or [HangState.SUSPECTED, HangState.CONFIRMED,
                                   HangState.SUSPECTED, HangState.CONFIRMED],
                        said, SimpleNamespace(dump_stacks=dumps), str(tmp_path),
                        policy=HangPolicy(), hold=lambda: held.append(1),
                        seen_working=lambda ranks, now: moved.append(list(ranks)) or True)
    w.asked, w.held = asked, held  # type: ignore[attr-defined]
    return w, said, moved


def report() -> Any:
    return SimpleNamespace(at=datetime.now(timezone.utc), liveness=[], progress=NO_STEPS,
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


WAIT = [("wait", "torch/distributed/distributed_c10d.py", 3000), ("<module>", "train.py", 20)]
SUSPECT_THEN_CONFIRM = [HangState.SUSPECTED, *[HangState.CONFIRMED] * 8]


def test_the_watch_confirms_once_min_looks_find_the_stack_in_place(tmp_path: Path) -> None:
    """One look a poll until the rank was seen MIN_LOOKS (4) times at one place."""
    w, said, moved = watch(tmp_path, [WAIT] * 5, SUSPECT_THEN_CONFIRM)  # 4, then the dump
    assert [w.observe(report()) for _ in range(3)] == [None] * 3  # looks 1, 2 (held), 3 (held)
    confirmed = w.observe(report())  # look 4: enough
    assert moved == [] and len(w.held) == 2  # type: ignore[attr-defined]
    assert confirmed is not None and said[-1].startswith("HangConfirmed: hang confirmed")


def test_two_looks_at_work_that_land_at_one_place_do_not_confirm_it(tmp_path: Path) -> None:
    """A loaded machine: one slow look in the suspicion and one at the confirmation, both in
    the evaluation's forward; the third finds the data loader: working, not confirmed."""
    w, said, moved = watch(tmp_path, [EVAL, EVAL, DATA], SUSPECT_THEN_CONFIRM)
    assert [w.observe(report()) for _ in range(3)] == [None] * 3
    assert moved == [[0]] and len(w.held) == 1  # type: ignore[attr-defined]
    assert said[-1].startswith("HangSuspected: not confirmed: the Python stack of rank(s) 0 "
                               "moves")


def test_looks_that_then_fail_hold_the_confirmation_at_most_more_looks_s(
        tmp_path: Path, monkeypatch: Any) -> None:
    import trainguard.controller.hang_watch as hw

    monkeypatch.setattr(hw, "MORE_LOOKS_S", 0.5)
    failed = StackDump(rank=0, pid=100, error="py-spy timed out")
    w, said, _ = watch(tmp_path, [WAIT] + [failed] * 40, [HangState.SUSPECTED]
                       + [HangState.CONFIRMED] * 40)
    w.observe(report())  # suspected: one look that worked
    started = time.monotonic()
    while w.observe(report()) is None:
        assert time.monotonic() - started < 5
    assert time.monotonic() - started >= 0.5 and len(w.held) >= 1  # type: ignore[attr-defined]
    assert said[-1].startswith("HangConfirmed: hang confirmed")


def test_without_a_look_that_works_the_confirmation_does_not_wait(tmp_path: Path) -> None:
    """py-spy missing or refused: more looks would say nothing more."""
    failed = StackDump(rank=0, pid=100, error="py-spy is not installed")
    w, said, _ = watch(tmp_path, [failed] * 3, SUSPECT_THEN_CONFIRM)
    w.observe(report())
    assert w.observe(report()) is not None and w.held == []  # type: ignore[attr-defined]
    assert said[-1].startswith("HangConfirmed: hang confirmed")


def test_the_looks_ask_only_for_the_stuck_ranks_python_frames(tmp_path: Path) -> None:
    w, _, _ = watch(tmp_path, [EVAL, DATA])
    w.observe(report())
    w.observe(report())
    assert [(c.ranks, c.native) for c in w.asked] == [([0], False), ([0], False)]  # type: ignore[attr-defined]


def test_work_then_a_stack_in_place_for_the_window_is_confirmed(
        tmp_path: Path, monkeypatch: Any) -> None:
    """An evaluation whose ranks then deadlock (uneven batches): the looks that found it
    working age out of the window, and the hang is confirmed (not after the allowance)."""
    import trainguard.controller.hang_watch as hw

    wait = [("wait", "torch/distributed/distributed_c10d.py", 3000),
            ("<module>", "train.py", 20)]
    monkeypatch.setattr(hw, "MOTION_WINDOW_S", 0.5)
    monkeypatch.setattr(hw, "MIN_LOOKS", 2)  # the window's aging is the point here
    w, said, moved = watch(tmp_path, [EVAL, DATA, wait, wait, wait], [
        HangState.SUSPECTED, HangState.CONFIRMED, HangState.SUSPECTED, HangState.CONFIRMED,
        HangState.CONFIRMED])
    w.observe(report())  # suspected: EVAL
    assert w.observe(report()) is None and moved == [[0]]  # about to confirm: DATA moved
    time.sleep(0.6)  # the working looks age out
    confirmed = w.observe(report())  # suspected again by the detector, then confirmed
    assert confirmed is None  # (the fake detector's third verdict: suspected, no look due)
    assert w.observe(report()) is None  # one look in the window: held for a second
    confirmed = w.observe(report())
    assert confirmed is not None and said[-1].startswith("HangConfirmed: hang confirmed")


def test_a_hang_left_running_says_so_and_how_to_restart_it(tmp_path: Path) -> None:
    """Walk-through 29, #12: with the default settings a confirmed hang sat for 5 minutes and
    only `report` named --restart-on-hang."""
    w, said, _ = watch(tmp_path, [WAIT] * 5, SUSPECT_THEN_CONFIRM)
    w.rec.spec.restart_on_hang = False  # type: ignore[attr-defined]
    w.rec.book = SimpleNamespace(hang_left_running=lambda *a: None)  # type: ignore[attr-defined]
    confirmed = None
    for _ in range(5):
        confirmed = confirmed or w.observe(report())
    assert confirmed is not None
    assert said[-1].endswith("Left running: --restart-on-hang is off (with it, or the "
                             "multi-node and llm presets, the hung ranks are restarted); "
                             "`trainguard stop` ends it"), said[-1]


def test_each_attempt_s_first_steps_get_the_warm_up_of_the_earlier_attempts() -> None:
    """Walk-through 33 #5: every attempt's first 3 steps take 12 s (compilation, autotuning,
    caches: a new process warms up again). Attempt 0 passed (start-up allowance until the
    cadence is learned); after a crash every attempt's second step was judged against the 8 s
    learned from attempt 0's steady steps, confirmed hung, and the job failed (86)."""
    det = HangDetector()

    def attempt(start: float, steps: int) -> list[Any]:
        det.start_attempt(at(start))
        t, verdicts = start, []
        for step in range(1, steps + 1):
            gap = 12.0 if step <= 3 else 0.5
            for dt in (gap / 2, gap):  # a poll halfway through the step, one at its end
                verdicts.append(det.observe([RankLiveness(
                    rank=0, last_step=step, last_progress_at=at(t) if step > 1 else None,
                    intervals=[])], at(t + dt)))
            t += gap
            det.observe([RankLiveness(rank=0, last_step=step, last_progress_at=at(t),
                                      intervals=[gap] if step > 1 else [])], at(t))
        return verdicts

    assert all(v.state == HangState.OK for v in attempt(0, 400))  # p99: 0.5 s, T: 8 s
    again = attempt(1000, 30)
    assert all(v.state == HangState.OK for v in again), [v.describe() for v in again
                                                           if v.state != HangState.OK]
    # past its warm-up the attempt's own cadence holds again: 8 s without progress is a hang
    det.observe([RankLiveness(rank=0, last_step=30, last_progress_at=at(1049.5))], at(1056))
    assert det.observe([RankLiveness(rank=0, last_step=30, last_progress_at=at(1049.5))],
                       at(1058)).state == HangState.CONFIRMED


def test_a_rank_that_did_not_join_a_save_is_not_lent_the_save_s_allowance() -> None:
    """Review of walk-through 33 #13: rank 1 hangs before the save of step 20; rank 0 sits in
    the Checkpointer's `checkpoint` phase waiting for rank 1's part. Rank 1 hid behind that
    phase's 1,800 s; it is confirmed at T."""
    det = HangDetector()
    _steady_pair(det)

    def poll(t: float) -> Any:
        return det.observe([RankLiveness(rank=0, last_step=20, last_progress_at=at(10),
                                         phase="checkpoint", phase_since=at(10.1)),
                            RankLiveness(rank=1, last_step=20, last_progress_at=at(10))], at(t))
    assert poll(16).state == HangState.SUSPECTED
    assert poll(19).state == HangState.CONFIRMED


def test_a_rank_that_did_its_part_of_a_save_waits_for_the_slow_one() -> None:
    """Walk-through 33 #1's save: rank 0's write of the replicated state takes 12 s; rank 1
    wrote its part (its own checkpoint phase ended) and waits in the next step's collective."""
    det = HangDetector()
    _steady_pair(det)
    det.observe([RankLiveness(rank=0, last_step=20, last_progress_at=at(10), phase="checkpoint",
                              phase_since=at(10.1)),
                 RankLiveness(rank=1, last_step=20, last_progress_at=at(10), phase="checkpoint",
                              phase_since=at(10.1))], at(10.2))
    for t in (11, 15, 19, 22):
        assert det.observe([RankLiveness(rank=0, last_step=20, last_progress_at=at(10),
                                         phase="checkpoint", phase_since=at(10.1)),
                            RankLiveness(rank=1, last_step=20, last_progress_at=at(10.5))],
                           at(t)).state == HangState.OK, t


def test_the_warm_up_allowance_is_the_last_attempt_s_not_every_earlier_one_s() -> None:
    """Review of walk-through 33 #10: one 300 s stall among attempt 0's first steps made T
    900 s for the first steps of every later attempt, after attempts that warmed up in 1 s."""
    det = HangDetector()

    def attempt(start: float, first_gaps: list[float]) -> None:
        det.start_attempt(at(start))
        t = start
        for step, gap in enumerate([*first_gaps, *[0.5] * 400], 1):
            t += gap
            det.observe([RankLiveness(rank=0, last_step=step, last_progress_at=at(t),
                                      intervals=[gap] if step > 1 else [])], at(t))

    attempt(0, [1, 1, 300, 1])
    det.start_attempt(at(10_000))
    assert det.threshold()[0] == 900  # attempt 1's first steps: attempt 0's warm-up
    attempt(20_000, [1, 1, 1, 1])
    det.start_attempt(at(30_000))
    assert det.threshold()[0] == 8  # the last attempt warmed up in a second: the floor
