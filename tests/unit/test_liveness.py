"""The hang detector (liveness.py): learned threshold, allowances, activity, two stages."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from trainguard.hang.detector import HangDetector, HangPolicy, HangState, p99
from trainguard.protocol import RankLiveness

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def live(rank: int, last: float | None, *, step: int | None = None,
         intervals: list[float] | None = None, output: float | None = None,
         io: int | None = None, cpu: float | None = None, phase: str | None = None,
         phase_since: float | None = None, phase_timeout: float | None = None) -> RankLiveness:
    return RankLiveness(
        rank=rank, last_step=step, last_progress_at=None if last is None else at(last),
        intervals=intervals or [], phase=phase,
        phase_since=None if phase_since is None else at(phase_since),
        phase_timeout_s=phase_timeout, last_output_at=None if output is None else at(output),
        cpu_s=cpu, io_bytes=io)


def run_steady(det: HangDetector, ranks: int, step_s: float, until: float) -> float:
    """Feed a healthy job (every rank steps every step_s, polled each step); last time."""
    t, step = 0.0, 0
    det.start_attempt(at(0))
    while t < until:
        t += step_s
        step += 1
        v = det.observe([live(r, t, step=step, intervals=[step_s] if step > 1 else [])
                         for r in range(ranks)], at(t))
        assert v.state == HangState.OK, (t, v)
    return t


def test_p99_is_the_value_below_which_99_percent_fall() -> None:
    assert p99([1.0] * 99 + [50.0]) == 1.0
    assert p99([1.0] * 98 + [50.0, 50.0]) == 50.0
    assert p99([]) is None


def test_a_steady_job_that_stops_is_suspected_then_confirmed_at_the_floor() -> None:
    det = HangDetector(HangPolicy(floor_s=8.0))
    t = run_steady(det, 4, 0.1, 30.0)
    assert det.threshold()[0] == 8.0  # 3 x p99 0.1 s is under the floor
    states = {}
    for dt in (1.0, 5.0, 5.4, 7.9, 8.1):
        v = det.observe([live(r, t, step=300) for r in range(4)], at(t + dt))
        states[dt] = v.state
    assert states[1.0] == HangState.OK
    assert states[5.4] == HangState.SUSPECTED  # 2/3 of 8 s
    assert states[7.9] == HangState.SUSPECTED
    assert states[8.1] == HangState.CONFIRMED
    v = det.observe([live(r, t, step=300) for r in range(4)], at(t + 9))
    assert v.stuck_ranks == (0, 1, 2, 3) and v.last_progress_at == at(t)


def test_the_learned_threshold_is_three_times_the_p99_step() -> None:
    det = HangDetector(HangPolicy(floor_s=8.0))
    t = run_steady(det, 2, 5.0, 200.0)
    threshold, basis = det.threshold()
    assert threshold == 15.0 and "p99" in basis
    assert det.observe([live(0, t), live(1, t)], at(t + 14)).state == HangState.SUSPECTED
    assert det.observe([live(0, t), live(1, t)], at(t + 15.1)).state == HangState.CONFIRMED


def test_one_stuck_rank_is_enough_and_is_named() -> None:
    det = HangDetector()
    t = run_steady(det, 3, 0.5, 20.0)
    v = det.observe([live(0, t + 20), live(1, t), live(2, t + 20)], at(t + 20))
    assert v.state == HangState.SUSPECTED  # first seen late: confirmed at the next poll
    v = det.observe([live(0, t + 20), live(1, t), live(2, t + 20)], at(t + 20.1))
    assert v.state == HangState.CONFIRMED and v.stuck_ranks == (1,)


def test_no_false_alarm_when_step_time_varies_tenfold_and_saves_pause_twenty_fold() -> None:
    rnd = random.Random(7)
    det = HangDetector()
    det.start_attempt(at(0))
    t, base = 0.0, 0.05
    for step in range(1, 4_000):
        dt = base * rnd.uniform(1, 10)
        if step % 50 == 0:
            dt = base * 20  # a checkpoint save, not marked as a phase
        # the poll may come anywhere inside the step: check the worst moment, just before it
        v = det.observe([live(0, t, step=step - 1)], at(t + dt * 0.999))
        assert v.state == HangState.OK, (step, dt, det.threshold())
        t += dt
        det.observe([live(0, t, step=step, intervals=[dt])], at(t))


def test_output_or_io_after_the_suspicion_delays_the_confirmation() -> None:
    det = HangDetector(HangPolicy(floor_s=8.0, life_cap=3.0))
    t = run_steady(det, 2, 0.1, 5.0)
    det.observe([live(0, t, output=t, io=0), live(1, t)], at(t + 6))  # suspected
    v = det.observe([live(0, t, output=t + 7, io=0), live(1, t)], at(t + 9))
    assert v.state == HangState.SUSPECTED and v.waiting_for == "rank 0 still prints output"
    v = det.observe([live(0, t, output=t + 7, io=50 << 20), live(1, t)], at(t + 11))
    assert v.state == HangState.SUSPECTED and "reads or writes" in (v.waiting_for or "")
    # life forever does not hide a hang forever: life_cap x threshold
    v = det.observe([live(0, t, output=t + 23, io=100 << 20), live(1, t)], at(t + 24.5))
    assert v.state == HangState.CONFIRMED


def test_cpu_alone_is_not_life() -> None:
    det = HangDetector(HangPolicy(floor_s=8.0))
    t = run_steady(det, 2, 0.1, 5.0)
    det.observe([live(0, t, cpu=10.0), live(1, t, cpu=10.0)], at(t + 6))
    v = det.observe([live(0, t, cpu=19.0), live(1, t, cpu=10.0)], at(t + 8.5))
    assert v.state == HangState.CONFIRMED


def test_a_fixed_hang_timeout_overrides_the_learned_one() -> None:
    det = HangDetector(HangPolicy(fixed_s=60.0))
    t = run_steady(det, 1, 0.1, 5.0)
    assert det.observe([live(0, t)], at(t + 30)).state == HangState.OK
    assert det.observe([live(0, t)], at(t + 45)).state == HangState.SUSPECTED
    assert det.observe([live(0, t)], at(t + 61)).state == HangState.CONFIRMED


def test_start_up_has_its_own_allowance() -> None:
    det = HangDetector(HangPolicy(startup_s=120.0))
    det.start_attempt(at(0))
    assert det.observe([live(0, None)], at(70)).state == HangState.OK
    assert det.observe([live(0, None)], at(90)).state == HangState.SUSPECTED
    v = det.observe([live(0, None)], at(121))
    assert v.state == HangState.CONFIRMED and "start-up" in v.basis


def test_a_marked_phase_has_its_own_allowance() -> None:
    det = HangDetector(HangPolicy(floor_s=8.0))
    t = run_steady(det, 1, 0.1, 5.0)
    ev = [live(0, t, phase="eval", phase_since=t, phase_timeout=60.0)]
    assert det.observe(ev, at(t + 30)).state == HangState.OK
    v = det.observe(ev, at(t + 61))
    assert v.state in (HangState.SUSPECTED, HangState.CONFIRMED)
    assert "phase 'eval'" in v.basis


def test_a_phase_s_own_allowance_is_never_below_the_threshold() -> None:
    """Review 48 #1: an evaluation batch's allowance (300 s by default) under steps slow
    enough for a longer threshold (a fixed 600 s here) is the threshold: a phase is work slow
    on purpose, never held to less than a step."""
    det = HangDetector(HangPolicy(fixed_s=600.0))
    t = run_steady(det, 1, 0.1, 5.0)
    ev = [live(0, t, phase="validation", phase_since=t, phase_timeout=300.0)]
    assert det.observe(ev, at(t + 350)).state == HangState.OK
    v = det.observe(ev, at(t + 601))
    assert v.state in (HangState.SUSPECTED, HangState.CONFIRMED)
    assert "phase 'validation' allowance 600s" in v.basis


def test_the_integrations_per_batch_allowance_comes_from_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from trainguard.integrations.marked import EVAL_BATCH_S, batch_allowance
    from trainguard.worker.contract import ENV_EVAL_BATCH_S

    for value, want in (("6", 6.0), ("0.5", 0.5), ("", EVAL_BATCH_S), ("abc", EVAL_BATCH_S),
                        ("0", EVAL_BATCH_S), ("-3", EVAL_BATCH_S), ("inf", EVAL_BATCH_S),
                        ("nan", EVAL_BATCH_S)):
        monkeypatch.setenv(ENV_EVAL_BATCH_S, value)
        assert batch_allowance() == want, value


def test_progress_clears_a_suspicion_and_a_new_attempt_keeps_the_cadence() -> None:
    det = HangDetector(HangPolicy(floor_s=8.0))
    t = run_steady(det, 1, 2.0, 60.0)
    assert det.observe([live(0, t)], at(t + 6)).state == HangState.SUSPECTED
    assert det.observe([live(0, t + 6.5, intervals=[6.5])], at(t + 7)).state == HangState.OK
    learned = det.learned_p99()
    det.start_attempt(at(t + 100))
    assert det.learned_p99() == learned


def test_a_varying_accelerator_load_is_life_a_flat_one_is_not() -> None:
    det = HangDetector(HangPolicy(floor_s=8.0))
    t = run_steady(det, 1, 0.1, 5.0)
    for i, util in enumerate((100, 100, 100, 100)):  # NCCL spinning: flat 100%
        v = det.observe([RankLiveness(rank=0, last_progress_at=at(t), accel_util=util)],
                        at(t + 6 + i))
    assert v.state == HangState.CONFIRMED
    det.start_attempt(at(t + 100))
    t2 = t + 100
    for i, util in enumerate((50, 10, 80, 30)):  # real work: the load varies
        v = det.observe([RankLiveness(rank=0, last_progress_at=at(t2), accel_util=util)],
                        at(t2 + 6 + i * 0.9))
    assert v.state == HangState.SUSPECTED and "accelerator" in (v.waiting_for or "")


def test_a_rank_left_running_while_the_job_ends_is_not_confirmed_hung() -> None:
    """Rank 1 exited 0 (the job is ending): rank 0, still finishing, gets the ending
    allowance instead of the hang timeout; without `ending` the same idle is a hang."""
    det = HangDetector(HangPolicy(fixed_s=1.0, phase_s=600.0))
    t = run_steady(det, 2, 0.1, 2.0)
    for dt in (0.8, 2.0, 5.0):
        v = det.observe([live(0, t)], at(t + dt), ending="rank(s) 1 exited 0")
        assert v.state == HangState.OK, v
    assert det.observe([live(0, t)], at(t + 6.0)).state == HangState.SUSPECTED
    assert det.observe([live(0, t)], at(t + 7.0)).state == HangState.CONFIRMED


def test_a_memory_snapshot_after_every_step_still_teaches_the_cadence() -> None:
    """With `--memory-every 1` each step ends in a `checkpoint` phase (the snapshot copy);
    the agent dropped every gap after a phase, so the controller never learned the cadence
    and judged hangs by the start-up allowance (30 minutes) for the whole job (found by the
    chaos run: a SIGSTOPped rank was not confirmed as hung)."""
    from trainguard.node.liveness import LivenessBook

    book = LivenessBook()
    book.reset({0: 100})
    t = 0.0
    for step in range(1, 6):
        book.progress(0, step, at(t))  # trainguard.progress(step)
        book.phase(0, "checkpoint", "begin", at(t + 0.01), None)
        book.phase(0, "checkpoint", "end", at(t + 0.05), None)  # the snapshot copied
        t += 0.3
    (rank,) = book.report({0}, {})
    assert len(rank.intervals) == 4
    assert all(abs(x - 0.25) < 1e-6 for x in rank.intervals)  # from the phase's end
    det = HangDetector()
    det.start_attempt(at(0))
    det.observe([rank], at(t))
    assert det.threshold()[1].startswith("max(")  # learned, not the start-up allowance


def test_a_gap_with_a_phase_still_open_is_not_the_cadence() -> None:
    from trainguard.node.liveness import LivenessBook

    book = LivenessBook()
    book.reset({0: 100})
    book.progress(0, 1, at(0))
    book.phase(0, "eval", "begin", at(0.1), None)
    book.progress(0, 2, at(60))  # progress reported from inside a long evaluation
    (rank,) = book.report({0}, {})
    assert rank.intervals == []


def test_a_gap_of_many_fast_steps_teaches_the_cadence() -> None:
    """Walk-through 39 #2: progress is sent at most every 0.2 s, so a job of 14 fast steps
    reported one gap; three gaps were needed before the cadence counted, and a hang at the
    next step had the 1800 s start-up allowance. A gap counts as the steps it covers."""
    det = HangDetector(HangPolicy(floor_s=8.0))
    det.start_attempt(at(0))
    assert det.observe([live(0, 1.0, step=1)], at(1.0)).state == HangState.OK
    assert det.observe([live(0, 1.2, step=14, intervals=[0.2])], at(1.2)).state == HangState.OK
    threshold, basis = det.threshold()
    assert threshold == 8.0 and "p99" in basis, basis
    assert det.observe([live(0, 1.2, step=14)], at(7.0)).state == HangState.SUSPECTED
    assert det.observe([live(0, 1.2, step=14)], at(9.5)).state == HangState.CONFIRMED
    # one gap of one step is not a cadence yet: the start-up allowance holds
    slow = HangDetector(HangPolicy(floor_s=8.0))
    slow.start_attempt(at(0))
    slow.observe([live(0, 1.0, step=1)], at(1.0))
    slow.observe([live(0, 3.0, step=2, intervals=[2.0])], at(3.0))
    assert "start-up allowance" in slow.threshold()[1]
    assert slow.observe([live(0, 3.0, step=2)], at(60.0)).state == HangState.OK


def snapshots(book: Any, rank: int, steps: range, every_s: float, t0: float = 0.0) -> float:
    """What the memory tier sends for each snapshot: its `checkpoint` phase, then the
    snapshot_taken of its step (node/agent.py: LivenessBook.implied). Returns the last time."""
    t = t0
    for i, step in enumerate(steps):
        t = t0 + i * every_s
        book.phase(rank, "checkpoint", "begin", at(t - 0.01), None)
        book.phase(rank, "checkpoint", "end", at(t), None)
        book.implied(rank, step, at(t + 0.001))
    return t


def test_memory_snapshots_are_the_progress_of_a_job_that_reports_no_steps() -> None:
    """Walk-through 40 #2: a job that printed no steps took a memory snapshot every 10 steps
    (the llm preset), then hung: with no progress at all it waited out the 30-minute
    start-up allowance. The snapshots are its progress and teach its cadence, from one
    snapshot to the next (review 50 #1: measured from the snapshot's own phase end, it was
    1 ms, and a healthy job with snapshots 10 s apart was confirmed hung at the 8 s floor)."""
    from trainguard.node.liveness import LivenessBook

    book = LivenessBook()
    book.reset({0: 100})
    t = snapshots(book, 0, range(10, 60, 10), every_s=10.0)
    (rank,) = book.report({0}, {})
    assert (rank.last_step, rank.last_progress_at, rank.intervals) == (None, None, [])
    assert (rank.implied_step, rank.implied_at) == (50, at(t + 0.001))
    assert rank.implied_intervals == [pytest.approx(10.0, abs=0.02)] * 4  # (its own phase off)
    det = HangDetector(HangPolicy(floor_s=8.0))
    det.start_attempt(at(0))
    assert det.observe([rank], at(t)).state == HangState.OK
    threshold, basis = det.threshold()
    assert threshold == pytest.approx(30.0, abs=0.1) and "p99" in basis, basis  # 3 x 10 s
    quiet = rank.model_copy(update={"implied_intervals": []})
    assert det.observe([quiet], at(t + 15.0)).state == HangState.OK  # between two snapshots
    assert det.observe([quiet], at(t + 25.0)).state == HangState.SUSPECTED
    confirmed = det.observe([quiet], at(t + 31.0))
    assert confirmed.state == HangState.CONFIRMED
    assert "progress: the ranks' memory snapshots" in confirmed.basis  # (review 51 #4)


def test_a_job_that_reports_steps_is_not_judged_by_its_snapshots() -> None:
    """Review 49 #1, review 50 #2: rank 0 prints its steps, rank 1 prints none and takes
    memory snapshots; the silent rank is judged by the job's progress (as before
    snapshots counted), not by its snapshots, which came once per 10 steps and made it
    suspected at each; the step lines are still read once a snapshot came first, and no
    cadence learned from snapshots outlives the first reported step."""
    from trainguard.node.liveness import LivenessBook

    book = LivenessBook()
    book.reset({0: 100, 1: 101})
    t = snapshots(book, 1, range(10, 50, 10), every_s=10.0)  # before rank 0's first line
    det = HangDetector(HangPolicy(floor_s=8.0))
    det.start_attempt(at(0))
    det.observe(book.report({0, 1}, {}), at(t))
    assert det.threshold()[0] == pytest.approx(30.0, abs=0.1)  # the snapshots' cadence, for now
    for i in range(40):  # rank 0's step lines, 0.5 s apart
        book.progress(0, 41 + i, at(t + 1 + i * 0.5))
    book.implied(1, 50, at(t + 6))
    last = t + 1 + 39 * 0.5
    assert det.observe(book.report({0, 1}, {}), at(last)).state == HangState.OK
    threshold, basis = det.threshold()
    assert threshold == 8.0 and "p99 0.500s" in basis, basis  # the steps', not 30 s
    # rank 1's last snapshot is 14 s old, rank 0's step fresh: no suspicion of rank 1
    assert det.observe(book.report({0, 1}, {}), at(last + 2)).state == HangState.OK
    book.implied(1, 60, at(last + 3))  # later snapshots change nothing either
    assert det.observe(book.report({0, 1}, {}), at(last + 5)).state == HangState.OK
    assert det.observe(book.report({0, 1}, {}), at(last + 6)).state == HangState.SUSPECTED


def test_a_marked_phase_between_two_snapshots_is_not_their_cadence() -> None:
    """Review 51 #1: a 600 s evaluation (marked, as the docs advise) between two snapshots
    10 s apart made the interval 610 s and the threshold 1830 s: a job that printed no steps
    again waited out the 30-minute allowance. The phases' time is taken off the interval."""
    from trainguard.node.liveness import LivenessBook

    book = LivenessBook()
    book.reset({0: 100})
    t = snapshots(book, 0, range(10, 50, 10), every_s=10.0)
    book.phase(0, "eval", "begin", at(t + 5), None)
    book.phase(0, "inner", "begin", at(t + 6), None)  # nested: counted once, with its outer
    book.phase(0, "inner", "end", at(t + 300), None)
    book.phase(0, "eval", "end", at(t + 605), None)
    snapshots(book, 0, range(50, 80, 10), every_s=10.0, t0=t + 610)
    (rank,) = book.report({0}, {})
    assert rank.implied_intervals == [pytest.approx(10.0, abs=0.02)] * 6, rank.implied_intervals
