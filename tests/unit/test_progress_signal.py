"""controller/progress_signal.py: a job whose ranks print but report no step is told once
that hang detection and the no-progress guard have nothing to go by (walk-through 21)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any

from trainguard.controller.progress_signal import ProgressSignal
from trainguard.protocol import NodeReport, Progress, RankLiveness

T0 = datetime(2026, 12, 4, 10, 0, tzinfo=timezone.utc)


def watch(**spec: Any) -> tuple[ProgressSignal, list[str]]:
    said: list[str] = []
    rec = SimpleNamespace(
        spec=SimpleNamespace(**{"hang_detection": True, "restart_on_hang": False, **spec}),
        event=lambda level, reason, message, **kw: said.append(f"{reason.value}: {message}"))
    return ProgressSignal(rec, warn_after_s=180), said  # type: ignore[arg-type]


def report(at_s: float, printed_s: float | None, step: int | None = None,
           progress_s: float | None = None) -> NodeReport:
    at = T0 + timedelta(seconds=at_s)
    lv = RankLiveness(rank=0, last_output_at=None if printed_s is None else
                      T0 + timedelta(seconds=printed_s),
                      last_progress_at=None if progress_s is None else
                      T0 + timedelta(seconds=progress_s))
    return NodeReport(node="n0", attempt=0, workers=[], progress=Progress(last_step=step),
                      at=at, liveness=[lv])


def test_ranks_that_print_and_never_report_a_step_are_told_once() -> None:
    w, said = watch()
    w.observe(report(10, None), 0)  # nothing printed yet: the clock has not started
    w.observe(report(100, 20), 0)
    assert said == []
    w.observe(report(199, 21), 0)  # 179 s of printing
    assert said == []
    w.observe(report(201, 200), 0)
    (told,) = said
    assert told.startswith("NoProgressSignal: no progress signal after 180s: the ranks print")
    assert "hang detection and the no-progress guard have nothing to go by" in told
    assert "--step-pattern" in told and "trainguard.progress(step)" in told
    w.observe(report(900, 800), 1)
    assert len(said) == 1  # once per launch


def test_a_step_or_any_progress_ends_the_watch_for_good() -> None:
    for seen in (report(50, 40, step=1), report(50, 40, progress_s=45)):
        w, said = watch()
        w.observe(seen, 0)
        w.observe(report(1000, 999), 0)  # a later silence is the hang detector's to judge
        assert said == []


def test_the_warning_names_what_the_job_turned_on() -> None:
    w, said = watch(hang_detection=True, restart_on_hang=True)
    w.observe(report(0, 0), 0)
    w.observe(report(181, 180), 0)
    assert "hang detection, --restart-on-hang and the no-progress guard" in said[0]
    w, said = watch(hang_detection=False)
    w.observe(report(0, 0), 0)
    w.observe(report(181, 180), 0)
    assert "no checkpoint was seen, so the no-progress guard has nothing to go by" in said[0]


def test_a_rank_that_printed_once_and_went_quiet_is_not_told_it_prints() -> None:
    """(review) 'Loading model...' then three quiet minutes is a load, not lines that are no
    step lines; and a new attempt's processes start the clock again."""
    w, said = watch()
    w.observe(report(0, 0), 0)
    w.observe(report(400, 1), 0)  # printed at 0 and 1 s only
    assert said == []
    w.observe(report(410, 200), 1)  # attempt 1: its own output from 200 s on
    w.observe(report(500, 300), 1)
    assert said == []
    w.observe(report(600, 381), 1)
    assert len(said) == 1


def test_lines_that_count_up_in_a_format_the_pattern_misses_are_said_at_once() -> None:
    """Walk-through 28: `it 15 | loss 0.83` went unread; the rank hung 3 s in and the hang
    sat out the 30-minute start-up allowance with no word."""
    w, said = watch(hang_detection=True, restart_on_hang=True)
    lv = RankLiveness(rank=1, last_output_at=T0 + timedelta(seconds=3),
                      unread_step_line="it 15 | loss 0.8312",
                      unread_step_pattern=r"\bit\W{0,3}(\d+)")
    w.observe(NodeReport(node="n0", attempt=0, workers=[], progress=Progress(),
                         at=T0 + timedelta(seconds=4), liveness=[lv]), 0)
    (told,) = said
    assert told.startswith("NoProgressSignal: rank 1's lines count up like steps "
                           "(`it 15 | loss 0.8312`) but --step-pattern does not read them")
    assert "Fix: --step-pattern '\\bit\\W{0,3}(\\d+)'" in told, told


def test_counting_lines_are_found_and_read_by_the_pattern_suggested() -> None:
    import re

    from trainguard.hang.step_lines import CountingLines, pattern_at

    lines = CountingLines()
    seen = [lines.observe(f"[rank1]: it {k} | loss {1 / k:.4f}") for k in range(1, 6)]
    assert seen == [None, None, None, 1, 1]  # three increases in a row, at the 2nd number
    pattern = pattern_at("[rank1]: it 4 | loss 0.2500", 1)
    assert pattern is not None
    assert re.search(pattern, "[rank1]: it 15 | loss 0.83").group(1) == "15"  # type: ignore[union-attr]
    assert pattern_at("[15/400] 0.83", 0) is None  # no word names the count
    clock = CountingLines()  # a clock's seconds count up too: no word names them
    assert all(clock.observe(f"2026-12-05 17:00:0{k} loading shard") is None
               for k in range(6))
    same = CountingLines()
    assert all(same.observe("epoch 1 done") is None for _ in range(5))


def test_memory_snapshots_do_not_end_the_watch_and_the_warning_says_what_they_leave_out(
        ) -> None:
    """Review 50 #3: a job whose ranks report no step but take memory snapshots is still
    told (goodput reads the warning: without it the job's time was all start-up); its hang
    detection goes by the snapshots, so the warning names what has nothing to go by."""
    w, said = watch(hang_detection=True, restart_on_hang=True)
    snap = report(201, 200)
    snap.liveness[0] = snap.liveness[0].model_copy(update={
        "implied_step": 40, "implied_at": T0 + timedelta(seconds=199)})
    w.observe(report(10, 5), 0)
    w.observe(snap, 0)
    (told,) = said
    assert ("so the no-progress guard has nothing to go by (hang detection goes by the ranks' "
            "memory snapshots)") in told, told
