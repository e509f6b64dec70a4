"""The goodput ledger's accounting on synthetic ledgers (trainguard.goodput.ledger)."""

from __future__ import annotations

import math
from itertools import pairwise
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard.goodput.ledger import (
    CAUSES,
    PRODUCTIVE,
    Attempt,
    Incident,
    LedgerInput,
    account,
)
from trainguard.goodput.step_time import ideal_step_s


def steps(attempt: int, first: int, last: int, t0: float, dt: float = 1.0
          ) -> list[tuple[int, int, float]]:
    """Steps first..last of `attempt`, step `first` done at t0, one every dt seconds."""
    return [(attempt, s, t0 + (s - first) * dt) for s in range(first, last + 1)]


def parts_sum(g) -> float:  # type: ignore[no-untyped-def]
    return g.productive_s + sum(g.seconds(c) for c in CAUSES)


def test_a_restart_at_17_after_a_checkpoint_at_10_wastes_exactly_7_steps() -> None:
    # attempt 0: starts at 0, step 1 at 5 s, ..., step 17 at 21 s; crash right at 21 s
    # attempt 1 starts at 23 s, resumes from step 10, steps 11..20 at 26..35 s
    inp = LedgerInput(
        start=0.0, end=36.0,
        attempts=[Attempt(0, 0.0, 22.0, launch=True), Attempt(1, 23.0, 36.0, launch=False)],
        incidents=[Incident(0, detected=21.5, fault=21.0, recovered=26.0, restarted=True,
                            resumed_step=10)],
        samples=steps(0, 1, 17, 5.0) + steps(1, 11, 20, 26.0))
    g = account(inp)
    assert g.steps_wasted == 7
    assert math.isclose(g.seconds("wasted_progress"), 7.0)
    assert math.isclose(g.seconds("detection"), 0.5)
    assert math.isclose(g.seconds("recovery"), 26.0 - 21.5)
    assert math.isclose(g.seconds("startup"), 5.0)
    assert math.isclose(g.productive_s, (16 - 7) + 9)  # 9 surviving intervals per attempt
    assert math.isclose(parts_sum(g), 36.0)
    assert g.steps_productive == 17 - 7 + 10


def test_the_gap_between_two_launches_is_queued_never_productive() -> None:
    inp = LedgerInput(
        start=0.0, end=1000.0,
        attempts=[Attempt(0, 0.0, 11.0, launch=True), Attempt(1, 900.0, 1000.0, launch=True)],
        samples=steps(0, 1, 10, 1.0) + steps(1, 11, 20, 901.0))
    g = account(inp)
    assert math.isclose(g.seconds("queued"), 889.0)
    assert g.ratio() is not None and g.ratio() < 0.05
    assert math.isclose(parts_sum(g), 1000.0)


def test_a_person_s_stop_until_the_relaunch_is_stopped_and_left_out_of_the_ratio() -> None:
    """Walk-through 42 #2: a job stopped for 31 s (while it queued for a node) and launched
    again read `queued 37.878s 36.7%` and goodput 41.8%: a job stopped for the night would
    read ~0%. A person's stop is `stopped` from its request to the relaunch's beginning, and
    not in the ratio; a queue before it stays `queued`; the cluster's stop (a requeue) is none."""
    from trainguard.goodput.ledger import STOPPED
    from trainguard.goodput.read import user_stops

    def job(stops: list[float]) -> LedgerInput:
        return LedgerInput(
            start=0.0, end=1000.0,
            attempts=[Attempt(0, 0.0, 11.0, launch=True),
                      Attempt(1, 900.0, 1000.0, launch=True, launched=895.0)],
            samples=steps(0, 1, 10, 1.0) + steps(1, 11, 20, 901.0), queues=[(0, 11.0)],
            stops=stops)

    g = account(job(user_stops([20.0], [(21.0, False)])))
    assert math.isclose(g.seconds("queued"), 20.0 - 11.0)  # the wait for a node, then
    assert math.isclose(g.seconds(STOPPED), 895.0 - 20.0)  # the stop until the relaunch
    assert math.isclose(parts_sum(g) + g.seconds(STOPPED), 1000.0)
    assert g.ratio() is not None and math.isclose(g.ratio(), round(g.productive_s / 125.0, 4))
    assert g.to_dict()["stopped_s"] == 875.0 and STOPPED not in g.badput_s()
    requeued = account(job(user_stops([20.0], [(21.0, True)])))  # Slurm's requeue
    assert requeued.seconds(STOPPED) == 0.0 and math.isclose(requeued.seconds("queued"), 884.0)
    # a stop with no request before it (an old store) starts at its end; a second stop
    # pairs with its own request only
    assert user_stops([5.0, 50.0], [(6.0, False), (40.0, False), (52.0, False)]) == [
        5.0, 40.0, 50.0]


def test_a_relaunch_s_own_start_up_is_start_up_as_the_first_launch_s_is() -> None:
    """Walk-through 26: a relaunch's pre-check and agents' start (5 s) were `queued`, while
    the first launch's same 5 s were `startup`."""
    inp = LedgerInput(
        start=0.0, end=1000.0,
        attempts=[Attempt(0, 5.0, 16.0, launch=True),
                  Attempt(1, 900.0, 1000.0, launch=True, launched=895.0)],
        samples=steps(0, 1, 10, 6.0) + steps(1, 11, 20, 901.0))
    g = account(inp)
    assert math.isclose(g.seconds("queued"), 895.0 - 16.0)
    assert math.isclose(g.seconds("startup"), 5.0 + 1.0 + 5.0 + 1.0)  # launch -> first step
    assert math.isclose(parts_sum(g), 1000.0)


def test_a_reschedule_s_wait_for_nodes_is_queued_while_it_waits_and_after() -> None:
    """(walk-through 23) A node lost at 11 s, the job rescheduled and waiting for a healthy
    node from 12 s (Queuing) to 32 s: that wait was `other` while it lasted (no record yet)
    and `recovery` once the next attempt ran; it is `queued` either way."""
    a0 = Attempt(0, 0.0, 11.5, launch=True)
    samples = steps(0, 1, 10, 1.0)
    waiting = account(LedgerInput(start=0.0, end=20.0, attempts=[a0], samples=samples,
                                  queues=[(0, 12.0)]))
    assert math.isclose(waiting.seconds("queued"), 8.0)
    assert math.isclose(parts_sum(waiting), 20.0)
    inc = Incident(0, detected=11.5, fault=11.0, recovered=34.0, restarted=True,
                   resumed_step=10)
    done = account(LedgerInput(
        start=0.0, end=40.0, attempts=[a0, Attempt(1, 32.0, 40.0, launch=False)],
        incidents=[inc], samples=samples + steps(1, 11, 17, 34.0), queues=[(0, 12.0)]))
    assert math.isclose(done.seconds("queued"), 20.0)
    assert math.isclose(done.seconds("recovery"), (12.0 - 11.5) + (34.0 - 32.0))
    assert math.isclose(done.seconds("detection"), 0.5)
    assert math.isclose(parts_sum(done), 40.0)


def test_a_lost_launcher_then_a_relaunch_wastes_the_steps_it_redid() -> None:
    # the launcher was SIGKILLed at step 30 (no end), relaunched; it resumed from 20
    inp = LedgerInput(
        start=0.0, end=100.0,
        attempts=[Attempt(0, 0.0, None, launch=True), Attempt(1, 50.0, 100.0, launch=True)],
        samples=steps(0, 1, 30, 1.0) + steps(1, 21, 60, 55.0))
    g = account(inp)
    assert g.steps_wasted == 10
    assert math.isclose(g.seconds("wasted_progress"), 10.0)
    assert math.isclose(g.seconds("queued"), 50.0 - 30.0)


def test_without_step_reports_a_restart_still_costs_time() -> None:
    inp = LedgerInput(
        start=0.0, end=60.0,
        attempts=[Attempt(0, 0.0, 31.0, launch=True, first_output=3.0),
                  Attempt(1, 32.0, 60.0, launch=False, first_output=40.0)],
        incidents=[Incident(0, detected=30.5, fault=30.0, restarted=True)])
    g = account(inp)
    assert not g.measured_steps
    assert math.isclose(g.seconds("recovery"), 40.0 - 30.5)
    assert math.isclose(g.seconds("detection"), 0.5)
    assert g.ratio() is not None and g.ratio() < 1.0
    assert math.isclose(parts_sum(g), 60.0)


def test_a_confirmed_hang_left_running_is_hang_time() -> None:
    inp = LedgerInput(start=0.0, end=100.0, attempts=[Attempt(0, 0.0, 100.0, launch=True)],
                      samples=steps(0, 1, 20, 1.0), hangs=[(0, 50.0)])
    g = account(inp)
    assert math.isclose(g.seconds("hang"), 80.0)
    assert math.isclose(g.productive_s, 19.0)


def test_a_hang_incident_counts_last_progress_to_confirmation_as_hang() -> None:
    inp = LedgerInput(
        start=0.0, end=60.0,
        attempts=[Attempt(0, 0.0, 41.0, launch=True), Attempt(1, 42.0, 60.0, launch=False)],
        incidents=[Incident(0, detected=40.0, fault=10.0, recovered=45.0, restarted=True,
                            hang=True, resumed_step=10)],
        samples=steps(0, 1, 10, 1.0) + steps(1, 11, 25, 45.0))
    g = account(inp)
    assert math.isclose(g.seconds("hang"), 30.0)
    assert math.isclose(g.seconds("recovery"), 5.0)
    assert g.steps_wasted == 0


def test_checkpoint_blocking_comes_out_of_productive_time() -> None:
    inp = LedgerInput(start=0.0, end=21.0, attempts=[Attempt(0, 0.0, 21.0, launch=True)],
                      samples=steps(0, 1, 20, 1.0), saves=[(10.0, 0.25), (20.0, 0.25)])
    g = account(inp)
    assert math.isclose(g.seconds("checkpoint_blocking"), 0.5)
    assert math.isclose(g.productive_s, 19.0 - 0.5)


def test_an_in_process_restart_counts_its_redone_steps() -> None:
    # one attempt; at 12 s the ranks restart in process and go back to step 5
    samples = [*steps(0, 1, 10, 1.0), (0, 6, 14.0), (0, 7, 15.0), (0, 12, 20.0)]
    inp = LedgerInput(start=0.0, end=20.0, attempts=[Attempt(0, 0.0, 20.0, launch=True)],
                      incidents=[Incident(0, detected=11.0, fault=10.5, recovered=14.0,
                                          restarted=True, ends_attempt=False,
                                          resumed_step=5)],
                      samples=samples)
    g = account(inp)
    assert g.steps_wasted == 5  # steps 6..10 of the first pass
    assert g.steps_productive == 12  # steps 1..12 once (walk-through 27: it read 11)
    assert math.isclose(parts_sum(g), 20.0)


def test_a_pass_first_sampled_past_its_resume_counts_the_steps_before_the_sample() -> None:
    # walk-through 27 F10: the in-process restart resumed after step 5, its first sample is
    # step 7 (a report came after two steps): step 6 of the second pass was counted nowhere
    samples = [*steps(0, 1, 10, 1.0), (0, 7, 15.0), (0, 12, 20.0)]
    inp = LedgerInput(start=0.0, end=20.0, attempts=[Attempt(0, 0.0, 20.0, launch=True)],
                      incidents=[Incident(0, detected=11.0, fault=10.5, recovered=15.0,
                                          restarted=True, ends_attempt=False,
                                          resumed_step=5)],
                      samples=samples)
    g = account(inp)
    assert (g.steps_productive, g.steps_wasted) == (12, 5)  # 1..12 once; 6..10 again
    assert math.isclose(parts_sum(g), 20.0)


def restarted_at_step_8(first_sample: int, resumed_step: int, end: float) -> LedgerInput:
    """Attempt 0 trains steps 1..8; attempt 1 (its incident says it resumed after
    `resumed_step`) is first sampled at `first_sample` and trains on to step 12."""
    return LedgerInput(start=0.0, end=end,
                       attempts=[Attempt(0, 0.0, 9.0, launch=True),
                                 Attempt(1, 10.0, end, launch=False)],
                       incidents=[Incident(0, detected=9.0, restarted=True,
                                           resumed_step=resumed_step)],
                       samples=[*steps(0, 1, 8, 1.0), *steps(1, first_sample, 12, 15.0)])


def test_an_attempt_first_sampled_past_its_resume_counts_the_steps_before_the_sample() -> None:
    # attempt 1 resumed after step 4 (its incident says so) and was first sampled at step 7
    g = account(restarted_at_step_8(first_sample=7, resumed_step=4, end=21.0))
    assert (g.steps_productive, g.steps_wasted) == (12, 4)  # 1..12 once; 5..8 again
    assert math.isclose(parts_sum(g), 21.0)


def test_a_resumed_step_at_or_past_the_first_sample_is_not_believed() -> None:
    g = account(restarted_at_step_8(first_sample=5, resumed_step=6, end=23.0))
    assert (g.steps_productive, g.steps_wasted) == (12, 4)  # the pass began after step 4


def test_ideal_step_time_drops_outliers_without_a_one_second_floor() -> None:
    times = [(1, 0.1)] * 50 + [(1, 0.12)] * 50 + [(1, 5.0)]
    ideal = ideal_step_s(times)
    assert ideal is not None and 0.1 <= ideal <= 0.12


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 30), st.floats(0.5, 20), st.booleans(),
                          st.integers(0, 40)), min_size=1, max_size=6),
       st.floats(0, 50))
def test_the_parts_always_add_up_to_the_wall_time(
        plan: list[tuple[int, float, bool, int]], tail: float) -> None:
    """Random attempts (steps, step time, crashed?, resume point): every instant of the wall
    time has exactly one cause."""
    t = 0.0
    attempts, incidents, samples = [], [], []
    step = 0
    for i, (n, dt, crashed, back) in enumerate(plan):
        attempts.append(Attempt(i, t, None, launch=i == 0))
        t += dt
        for _ in range(n):
            step += 1
            samples.append((i, step, t))
            t += dt / 4
        end = t + 0.1
        attempts[-1] = Attempt(i, attempts[-1].start, end, launch=i == 0)
        if crashed:
            step = max(0, step - back)
            incidents.append(Incident(i, detected=t + 0.05, fault=t, restarted=True,
                                      resumed_step=step))
        t = end + 0.2
    inp = LedgerInput(start=0.0, end=t + tail, attempts=attempts, incidents=incidents,
                      samples=samples, saves=[(s[2], 0.01) for s in samples[::3]])
    g = account(inp)
    assert math.isclose(parts_sum(g), t + tail, rel_tol=1e-9, abs_tol=1e-6)
    assert all(s.cause in (*CAUSES, PRODUCTIVE) for s in g.segments)
    assert all(a.end <= b.start + 1e-9 for a, b in pairwise(g.segments))


def test_an_async_saves_wait_is_placed_where_the_loop_waited_not_at_its_commit(
        tmp_path: Path) -> None:
    """Walk-through 19, a flaky object store: step 90's save blocked the loop 6.387 s and
    committed 9.839 s after the loop went on; step 100's blocked 8.581 s and committed 0.137 s
    after. Both painted as ending at their commits (0.1 s apart), they overlapped and 6.4 s of
    stalled loop counted as productive (checkpoint_blocking 8.67 s against 15.06 s)."""
    from datetime import datetime, timezone

    from trainguard.controller.store import JobStore
    from trainguard.goodput.read import ledger_input, saves
    from trainguard.records import Event, Involved, Level, iso

    t = datetime(2026, 12, 4, 2, 52, 10, tzinfo=timezone.utc)
    with JobStore.create(tmp_path, "tg-s3") as store:
        for at, step, blocked, before in ((t.timestamp() - 0.1, 90, 6.387, 9.839),
                                          (t.timestamp(), 100, 8.581, 0.137)):
            store.add_event(Event(datetime.fromtimestamp(at, timezone.utc), Level.INFO,
                                  "CheckpointSaved", f"checkpoint of step {step} committed",
                                  Involved("tg-s3", rank=0, attempt=0),
                                  {"step": step, "blocked_s": blocked,
                                   "resumed_before_s": before}))
        commits = saves(store)
    assert [(c.step, c.resumed_before_s) for c in commits] == [(90, 9.839), (100, 0.137)]
    t0 = t.timestamp() - 30
    inp = ledger_input({"created_at": iso(datetime.fromtimestamp(t0, timezone.utc))}, [],
                       steps(0, 1, 39, t0), commits, [], None,
                       datetime.fromtimestamp(t0 + 40, timezone.utc))
    assert inp.saves == [(commits[0].at - 9.839, 6.387), (commits[1].at - 0.137, 8.581)]
    g = account(inp)
    assert math.isclose(g.seconds("checkpoint_blocking"), 6.387 + 8.581, abs_tol=1e-6)
    assert math.isclose(parts_sum(g), g.wall_s)


def test_a_live_job_s_start_up_before_its_first_step_is_not_productive() -> None:
    """Walk-through 38 #4: a job that printed, then loaded its data for 8 s, read 92%
    goodput (its first output started 'productive') until step 1 came. Only a job known to
    report no steps (it ended without one, or NoProgressSignal said so) counts from its
    first output; a finished job run again, whose new attempt reports no step, trains
    nothing in it either."""
    a0 = Attempt(0, 0.0, None, launch=True, first_output=1.0)
    live = account(LedgerInput(start=0.0, end=9.0, attempts=[a0], reports_no_steps=False))
    assert live.productive_s == 0.0 and math.isclose(live.seconds("startup"), 9.0)
    known = account(LedgerInput(start=0.0, end=9.0, attempts=[a0]))  # told: no steps
    assert math.isclose(known.productive_s, 8.0)
    rerun = account(LedgerInput(
        start=0.0, end=30.0,
        attempts=[Attempt(0, 0.0, 11.0, launch=True, first_output=0.5),
                  Attempt(1, 20.0, 30.0, launch=True, first_output=24.0)],
        samples=steps(0, 1, 10, 1.0)))
    assert math.isclose(rerun.productive_s, 9.0)  # attempt 0's steps only
    assert math.isclose(rerun.seconds("startup"), 1.0 + 10.0)  # and the rerun's whole 10 s
    from datetime import datetime, timezone

    from trainguard.goodput.read import ledger_input

    now = datetime.fromtimestamp(100.0, timezone.utc)
    for meta, told, known in (({"state": "running"}, False, False),
                              ({"state": "running"}, True, True),
                              ({"state": "succeeded"}, False, True),
                              # review 45 #1: one that ended otherwise before a step: start-up
                              ({"state": "failed"}, False, False),
                              ({"state": "stopped"}, False, False)):
        inp = ledger_input(meta, [], [], [], [], None, now, told_no_steps=told)
        assert inp.reports_no_steps is known, (meta, told)


def test_a_job_whose_checkpoints_are_its_only_progress_counts_from_its_first_output() -> None:
    """Review 46 #1: a `--quiet` job that commits checkpoints never gets NoProgressSignal
    (a checkpoint is progress to the hang watch), so it read 0% goodput running, stopped,
    failed or lost: committed checkpoints with no step report at all mean it reports none."""
    from datetime import datetime, timezone

    from trainguard.goodput.read import Save, ledger_input

    now = datetime.fromtimestamp(100.0, timezone.utc)
    save = Save(at=50.0, attempt=0, step=100, blocked_s=None, resumed_before_s=0.0,
                on_exit=False, by_agent=False)
    for state in ("running", "stopped", "failed", "lost"):
        inp = ledger_input({"state": state}, [], [], [save], [], None, now)
        assert inp.reports_no_steps, state
    # review 47 #5: a step-0 save before the first step report trained nothing
    step0 = Save(at=50.0, attempt=0, step=0, blocked_s=None, resumed_before_s=0.0,
                 on_exit=False, by_agent=False)
    assert not ledger_input({"state": "failed"}, [], [], [step0], [], None, now).reports_no_steps
    # review 48 #5: nor did a save of the step its attempt resumed from (an exit save while
    # it still loaded): only a commit past that step is training
    def no_steps(resumed: dict[int, int]) -> bool:
        return ledger_input({"state": "failed"}, [], [], [save], [], None, now,
                            resumed=resumed).reports_no_steps

    assert not no_steps({0: 100}) and no_steps({0: 40}) and no_steps({1: 100})
    # a job that reports steps and checkpoints stays a step-reporting one
    stepping = ledger_input({"state": "running"}, [], [(0, 10, 40.0)], [save], [], None, now)
    assert not stepping.reports_no_steps
    a0 = Attempt(0, 0.0, None, launch=True, first_output=1.0)
    g = account(LedgerInput(start=0.0, end=9.0, attempts=[a0], reports_no_steps=True))
    assert math.isclose(g.productive_s, 8.0) and g.to_dict()["output_counts"]
    assert not account(LedgerInput(start=0.0, end=9.0, attempts=[a0],
                                   reports_no_steps=False)).to_dict()["output_counts"]


def test_the_goodput_of_a_job_reads_the_step_each_attempt_resumed_from(tmp_path: Path) -> None:
    """Review 48 #5 through the store: a job that resumed another run's step 500 and saved
    step 500 again on its way out, reporting no step, read 99.5% productive."""
    from datetime import datetime, timezone

    from trainguard.controller.store import JobStore
    from trainguard.goodput.read import job_goodput
    from trainguard.records import Event, Involved, Level, Reason, RunningRecord, StartType

    t0 = datetime(2026, 12, 1, tzinfo=timezone.utc)
    at = datetime.fromtimestamp(t0.timestamp() + 995, timezone.utc)
    with JobStore.create(tmp_path / "job", "r") as s:
        s.set_meta(state="failed", created_at=t0.isoformat(),
                   ended_at=datetime.fromtimestamp(t0.timestamp() + 1000, timezone.utc)
                   .isoformat())
        rec = RunningRecord(0, t0, StartType.FIRST_START)
        rec.first_output_at = datetime.fromtimestamp(t0.timestamp() + 5, timezone.utc)
        rec.end_at = datetime.fromtimestamp(t0.timestamp() + 1000, timezone.utc)
        s.put_running(rec)
        who = Involved(job="r", rank=0, attempt=0)
        s.add_event(Event(t0, Level.INFO, Reason.RESUMED.value, "resumed", who, {"step": 500}))
        s.add_event(Event(at, Level.INFO, Reason.CHECKPOINT_SAVED.value, "saved", who,
                          {"step": 500, "on_exit": True}))
    with JobStore.open(tmp_path / "job") as r:
        g = job_goodput(r)
    assert g.productive_s == 0 and not g.to_dict()["output_counts"]


def test_a_restart_whose_attempt_failed_again_before_a_step_is_recovery_not_other() -> None:
    """Walk-through 40 #5: a deterministic error restarted three times, each attempt failing
    before its first step: the backoffs and the failed attempts read `other` (57.7% of the
    run). A restart that acted is recovery until it was found failed (the next fault)."""
    from datetime import datetime, timedelta, timezone

    from trainguard.goodput.read import ledger_input
    from trainguard.records import (
        FaultScenario,
        RecoverRecord,
        RecoverResult,
        RunningRecord,
        StartType,
    )

    t0 = datetime(2026, 12, 1, tzinfo=timezone.utc)

    def at(s: float) -> datetime:
        return t0 + timedelta(seconds=s)

    first = RunningRecord(0, at(0), StartType.FIRST_START)
    first.end_at = at(10)
    second = RunningRecord(1, at(15), StartType.AUTO_RESTART)  # after a 5 s backoff
    second.end_at = at(20)

    def incident(attempt: int, detected: float, result: RecoverResult, recover: str,
                 started: float | None, ended: float | None) -> RecoverRecord:
        return RecoverRecord(attempt=attempt, recover_start_at=at(detected),
                             fault_scenario=FaultScenario.ERROR_IN_LOG, reason="ValueError",
                             related_task="worker-0", recover=recover, recover_result=result,
                             fault_at=at(detected), detected_at=at(detected),
                             workers_started_at=None if started is None else at(started),
                             recover_end_at=None if ended is None else at(ended))

    first.recover_records.append(incident(0, 10, RecoverResult.FAILED, "process_restart", 15, 20))
    second.recover_records.append(incident(1, 20, RecoverResult.FAILED, "none", None, 20))
    meta = {"created_at": at(0).isoformat(), "state": "failed", "ended_at": at(21).isoformat()}
    g = account(ledger_input(meta, [first, second], [(0, 1, at(5).timestamp())], [], [], None,
                             at(21)))
    assert math.isclose(g.seconds("recovery"), 10.0), g.to_dict()  # 10 s -> 20 s
    assert g.seconds("other") <= 1.0 + 1e-9, g.to_dict()  # the failed end's last second
