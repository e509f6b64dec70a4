"""`trainguard report`'s advice lines (goodput/report.py advice_lines): pure."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from trainguard.goodput.interval import IntervalAdvice
from trainguard.goodput.report import advice_lines
from trainguard.records import FaultScenario

NO_INTERVAL = IntervalAdvice(mtbf_s=100.0, blocking_s=None, current_s=None, optimal_s=None,
                             loss_now=None, loss_optimal=None)


def report_input(saves: int) -> Any:
    goodput = SimpleNamespace(ideal_step_s=lambda: None, seconds=lambda cause: 0.0, wall_s=60.0,
                              steps_wasted=0)
    return SimpleNamespace(goodput=goodput, events=[], nodes=[], commits=[object()] * saves,
                           meta={}, records=[])


def test_the_interval_advice_says_why_there_is_none_without_telling_a_user_who_saves_to_save(
        ) -> None:
    # a job with one save through the Checkpointer: not "save through trainguard.checkpoint"
    (one,) = advice_lines(report_input(1), NO_INTERVAL)
    assert one == ("checkpoints: 1 save recorded; interval advice needs two saves in one "
                   "attempt's training loop with no failure between them")
    (none,) = advice_lines(report_input(0), NO_INTERVAL)
    assert none.startswith("checkpoints: no checkpoint saved yet"), none


def test_a_job_that_ended_without_progress_is_told_not_to_be_requeued() -> None:
    r = report_input(0)
    r.meta = {"exit_code": 86}
    first = advice_lines(r, NO_INTERVAL)[0]
    assert first.startswith("the job ended with exit 86: attempts kept failing without "
                            "progress (NoProgress); do not requeue it as it is"), first
    # walk-through 21: the hang budget's 86 was said to be NoProgress's
    r.events = [SimpleNamespace(reason="HangRestartLimitReached")]
    first = advice_lines(r, NO_INTERVAL)[0]
    assert first.startswith("the job ended with exit 86: restarts upon suspension kept "
                            "hanging without progress (HangRestartLimitReached)"), first
    # (review) the latest of the two says it: a relaunch that ended by NoProgress
    r.events.append(SimpleNamespace(reason="NoProgress"))
    assert "(NoProgress)" in advice_lines(r, NO_INTERVAL)[0]


def test_the_checkpoint_interval_is_the_gap_between_saves_of_one_attempt() -> None:
    from trainguard.goodput.interval import advise

    # attempt 0 saves at 0 and 1.1 s, dies; attempt 1 saves at 11.3 s and 12.4 s: the 10.2 s
    # across the restart is no interval the loop chose
    a = advise(60.0, 1, [(0, 0.0), (0, 1.1), (1, 11.3), (1, 12.4)], [0.01] * 4)
    assert a.current_s is not None and abs(a.current_s - 1.1) < 1e-9
    one_each = advise(60.0, 1, [(0, 0.0), (1, 10.2)], [0.01] * 2)
    assert one_each.current_s is None  # two saves, but not in one attempt


def test_time_a_crash_cut_short_is_not_called_steps_done_again() -> None:
    r = report_input(0)
    r.goodput.seconds = lambda cause: 13.0 if cause == "wasted_progress" else 0.0
    assert "wasted progress: 13.0s of a step a crash cut short (no step was done again)" in \
        advice_lines(r, NO_INTERVAL)
    r.goodput.steps_wasted = 5
    (line,) = [a for a in advice_lines(r, NO_INTERVAL) if a.startswith("wasted")]
    assert "(5 steps done again, and the steps cut short by a crash)" in line, line


def test_a_long_hang_left_running_is_answered_with_restart_on_hang() -> None:
    """Walk-through 9: 652 s of 656 hung, left running, and no word of --restart-on-hang."""
    from datetime import datetime, timezone

    from trainguard.records import RecoverRecord, RunningRecord, StartType

    t = datetime(2026, 12, 5, tzinfo=timezone.utc)

    def hang(recover: str) -> list[RunningRecord]:
        rec = RunningRecord(0, t, StartType.FIRST_START)
        rec.recover_records.append(RecoverRecord(
            attempt=0, recover_start_at=t, fault_scenario=FaultScenario.JOB_HANGED,
            reason="hang", related_task="job", recover=recover))
        return [rec]

    r = report_input(0)
    r.goodput.wall_s = 656.0
    r.goodput.seconds = lambda cause: 652.0 if cause == "hang" else 0.0
    assert not [a for a in advice_lines(r, NO_INTERVAL) if a.startswith("hangs:")]
    r.records = hang("none")
    (line,) = [a for a in advice_lines(r, NO_INTERVAL) if a.startswith("hangs:")]
    assert line.startswith("hangs: 652s (99% of the run) went to hangs, a confirmed one "
                           "left running; with --restart-on-hang"), line
    r.records = hang("process_restart")  # it was on: nothing to say
    assert not [a for a in advice_lines(r, NO_INTERVAL) if a.startswith("hangs:")]


def test_a_hang_left_once_its_budget_was_spent_is_not_told_to_turn_restarts_on() -> None:
    """Walk-through 24: --restart-on-hang on, its budget spent, the last hang left running:
    the advice said to turn on --restart-on-hang."""
    from datetime import datetime, timezone

    from trainguard.records import Involved, RecoverRecord, RunningRecord, StartType

    t = datetime(2026, 12, 5, tzinfo=timezone.utc)
    rec = RunningRecord(2, t, StartType.AUTO_RESTART)
    rec.recover_records.append(RecoverRecord(
        attempt=2, recover_start_at=t, fault_scenario=FaultScenario.JOB_HANGED, reason="hang",
        related_task="job", recover="none"))
    r = report_input(0)
    r.records, r.meta = [rec], {"budgets": {"max_hang_restarts": 2}}
    r.goodput.seconds = lambda cause: 33.0 if cause == "hang" else 0.0
    (off,) = [a for a in advice_lines(r, NO_INTERVAL) if a.startswith("hangs:")]  # flag off
    assert "a confirmed one left running; with --restart-on-hang" in off, off
    r.events = [SimpleNamespace(reason="HangRestartLimitReached",
                                involved=Involved(job="j", attempt=2))]
    (spent,) = [a for a in advice_lines(r, NO_INTERVAL) if a.startswith("hangs:")]
    assert "--restart-on-hang" not in spent and "2 restarts upon suspension in a row" in spent
    # walk-through 27: it named a flag `run` refuses (--max-hang-restarts) and said the last
    # hang was left running, while its ranks were stopped and the job failed
    assert "--max-hang-restarts" not in spent and "left running" not in spent, spent
    assert spent.startswith("hangs: 33s (55% of the run) went to hangs; the job gave up on the")


def test_failures_of_a_full_disk_get_no_advice_to_save_more_often() -> None:
    """Walk-through 24: every failure was a full checkpoint disk's, and the advice was to
    checkpoint more often (from the MTBF those failed saves made)."""
    from datetime import datetime, timezone

    from trainguard.records import RecoverRecord, RunningRecord, StartType

    t = datetime(2026, 12, 5, tzinfo=timezone.utc)
    rec = RunningRecord(0, t, StartType.FIRST_START)
    rec.recover_records.append(RecoverRecord(
        attempt=0, recover_start_at=t, fault_scenario=FaultScenario.ERROR_IN_LOG,
        reason="disk full", related_task="worker-0", recover="process_restart",
        category="disk_full_or_storage_io"))
    r = report_input(4)
    r.records = [rec]
    often = IntervalAdvice(mtbf_s=10.0, blocking_s=0.01, current_s=1.0, optimal_s=0.5,
                           loss_now=0.1, loss_optimal=0.05)
    (line,) = [a for a in advice_lines(r, often) if a.startswith("checkpoints:")]
    assert line.startswith("checkpoints: every failure was the storage's"), line
    rec.recover_records[0].category = "gpu_oom"  # another cause: the interval advice stands
    (line,) = [a for a in advice_lines(r, often) if a.startswith("checkpoints:")]
    assert line.startswith("checkpoints: every 1.0s now (too rarely)"), line
    # walk-through 40 #4: failures that lost no step (memory, a save on the way out) are no
    # reason to save ten times as often
    rec.recover_records[0].steps_lost = 0
    (line,) = [a for a in advice_lines(r, often) if a.startswith("checkpoints:")]
    assert line.startswith("checkpoints: every 1.0s now; no failure lost a step") and \
        "too rarely" not in line, line
    rec.recover_records[0].steps_lost = 3
    (line,) = [a for a in advice_lines(r, often) if a.startswith("checkpoints:")]
    assert line.startswith("checkpoints: every 1.0s now (too rarely)"), line


def test_a_gap_across_an_in_process_restart_is_no_interval_either() -> None:
    """Walk-through 37 #8: an in-process restart stays in its attempt, and the 10.7 s gap
    across it was counted: 'every 12.3s now (too rarely)' for saves 1 s apart."""
    from datetime import datetime, timezone

    from trainguard.goodput.metrics import interval_advice
    from trainguard.goodput.read import Save
    from trainguard.records import RecoverRecord, RunningRecord, StartType

    t0 = datetime(2026, 12, 6, 19, 12, tzinfo=timezone.utc)
    at = t0.timestamp()
    rec = RunningRecord(0, t0, StartType.FIRST_START)
    for fault_s in (5.0, 20.0):  # a SIGKILL, then a hang: both restarted in place
        rec.recover_records.append(RecoverRecord(
            attempt=0, recover_start_at=datetime.fromtimestamp(at + fault_s, timezone.utc),
            fault_scenario=FaultScenario.JOB_FAILED, reason="x", related_task="worker-1",
            recover="in_process_restart",
            fault_at=datetime.fromtimestamp(at + fault_s, timezone.utc)))
    # the walk-through's saves: gaps 12.3 and 19.1 across the restarts, 0.7 between two
    saves = [Save(at + s, 0, None, 0.01, 0.0, False, False) for s in (0.0, 12.3, 31.4, 32.1)]
    g = SimpleNamespace(wall_s=40.0, seconds=lambda cause: 0.0)
    advice = interval_advice(g, [rec], saves)  # type: ignore[arg-type]
    assert advice.current_s is not None and abs(advice.current_s - 0.7) < 1e-6, advice


def test_the_save_of_a_hung_job_s_last_step_is_in_the_stretch_before_the_hang() -> None:
    """Walk-through 38 #3: a hang's fault is its last progress, and the save of that step
    was committed just after it: it counted as after the fault, each stretch held one save,
    and the advice said '2 saves recorded; ... needs two'. A hang's stretch ends when it
    was confirmed."""
    from datetime import datetime, timezone

    from trainguard.goodput.metrics import interval_advice
    from trainguard.goodput.read import Save
    from trainguard.records import RecoverRecord, RunningRecord, StartType

    t0 = datetime(2026, 12, 6, 22, 38, tzinfo=timezone.utc)
    at = t0.timestamp()
    rec = RunningRecord(0, t0, StartType.FIRST_START)
    rec.recover_records.append(RecoverRecord(
        attempt=0, recover_start_at=datetime.fromtimestamp(at + 40.0, timezone.utc),
        fault_scenario=FaultScenario.JOB_HANGED, reason="hang", related_task="worker-1",
        recover="no_recovery", fault_at=datetime.fromtimestamp(at + 13.634, timezone.utc),
        detected_at=datetime.fromtimestamp(at + 38.0, timezone.utc)))
    saves = [Save(at + s, 0, None, 0.01, 0.0, False, False) for s in (11.115, 13.669)]
    g = SimpleNamespace(wall_s=60.0, seconds=lambda cause: 0.0)
    advice = interval_advice(g, [rec], saves)  # type: ignore[arg-type]
    assert advice.current_s is not None and abs(advice.current_s - 2.554) < 1e-6, advice


def test_an_mtbf_from_one_or_two_failures_is_said_to_be_rough() -> None:
    """Walk-through 42 #13: one failure in a 60 s run gave 'the optimal interval (Young/Daly)
    is 0.4s' from 'the observed MTBF 60s' with no word that one failure makes that MTBF."""
    from datetime import datetime, timezone

    from trainguard.goodput.interval import advise
    from trainguard.records import RecoverRecord, RunningRecord, StartType

    t = datetime(2026, 12, 7, tzinfo=timezone.utc)
    rec = RunningRecord(0, t, StartType.FIRST_START)
    rec.recover_records.append(RecoverRecord(
        attempt=0, recover_start_at=t, fault_scenario=FaultScenario.ERROR_IN_LOG,
        reason="killed", related_task="worker-0", recover="process_restart", steps_lost=3))
    r = report_input(4)
    r.records = [rec]
    saves = [(0, 0.0), (0, 1.0), (0, 2.0)]
    for failures, rough in ((1, " (an MTBF from 1 failure only: a rough guide until more are "
                                "seen)"), (2, " (an MTBF from 2 failures only"), (3, None)):
        a = advise(60.0, failures, saves, [0.01] * 3)
        (line,) = [x for x in advice_lines(r, a) if x.startswith("checkpoints:")]
        assert line.startswith("checkpoints: every 1.0s now"), line
        if rough is None:
            assert "rough" not in line, line
        else:
            assert rough in line, line
        assert a.to_dict()["failures"] == failures
