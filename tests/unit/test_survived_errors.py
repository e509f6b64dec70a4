"""An error a rank caught and trained past is not what it died of (walk-through 20, finding 1).

A script that catches a CUDA OOM, skips the batch and trains on, then is SIGKILLed minutes
later, was diagnosed as the OOM ("restart helps: no") and not restarted. The job's own ranks
tell when each reached the step before its latest (WorkerFact.second_last_step_at, from the
agent's liveness book); what a rank logged more than SURVIVED_BEFORE_STEP before that, it
trained past (two new steps: a progress bar redrawn at exit, after the fatal traceback, is
one). The exception a rank that exited by itself (a code > 0) died of always stays."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from trainguard.diagnosis.candidates import RankExit
from trainguard.diagnosis.rules import load_rules
from trainguard.diagnosis.sources import scan_lines
from trainguard.diagnosis.taxonomy import Category, RestartHelps
from trainguard.diagnosis.verdict import SURVIVED_BEFORE_STEP, diagnose
from trainguard.node.liveness import LivenessBook

T0 = datetime(2026, 12, 4, 12, 0, 0, tzinfo=timezone.utc)
OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
       "total capacity of 79.15 GiB of which 1.02 GiB is free.")


def stamped(seconds: float, stream: str, text: str) -> str:
    """A line of a trainguard rank log: the agent's stamp, the stream, the text."""
    return f"{(T0 + timedelta(seconds=seconds)).isoformat(timespec='microseconds')} {stream} {text}"


def rank0_log() -> list[str]:
    """Step 4, an OOM traceback the script printed at 5 s and caught, then steps again."""
    return [stamped(4.0, "out", "step 4 loss 0.250"),
            stamped(5.0, "err", "Traceback (most recent call last):"),
            stamped(5.0, "err", '  File "/work/train.py", line 7, in <module>'),
            stamped(5.0, "err", "    loss = model(batch)"),
            stamped(5.0, "err", OOM),
            stamped(5.0, "out", "skipping this batch after OOM"),
            stamped(5.2, "out", "step 6 loss 0.167")]


def verdict(second_last: datetime | None, rank: int = 0,  # type: ignore[no-untyped-def]
            code: int = -9, log: list[str] | None = None):
    findings = scan_lines(log or rank0_log(), "rank-0.log", rank=0)
    exits = [RankExit(0, True, code, T0 + timedelta(seconds=9), False, "node-0",
                      second_last if rank == 0 else None)]
    if rank != 0:  # another rank's steps say nothing of rank 0's lines
        exits.append(RankExit(rank, False, -15, T0 + timedelta(seconds=9), None, "node-0",
                              second_last))
    d = diagnose(findings, exits, load_rules())
    assert d is not None
    return d


def test_an_oom_the_rank_trained_past_gives_way_to_the_kill_it_died_of() -> None:
    d = verdict(T0 + timedelta(seconds=8))
    assert d.category == Category.KILLED_BY_SIGNAL_UNKNOWN
    assert d.restart_helps == RestartHelps.YES


def test_without_a_later_step_the_oom_is_still_the_cause() -> None:
    for last in (None, T0 + timedelta(seconds=4), T0 + timedelta(seconds=5.5)):
        d = verdict(last)  # no step, a step before it, one inside the margin
        assert d.category == Category.GPU_OOM, last
        assert d.restart_helps == RestartHelps.NO
    assert timedelta(seconds=0.5) < SURVIVED_BEFORE_STEP


def test_only_the_ranks_own_steps_count() -> None:
    assert verdict(T0 + timedelta(seconds=8), rank=1).category == Category.GPU_OOM


def test_the_liveness_book_times_new_steps_only() -> None:
    """A save, the end of a phase or the same step again moves the rank's progress (hang
    detection) but not its steps: an atexit save after a fatal traceback must not make that
    traceback look trained past."""
    book = LivenessBook()
    book.reset({0: 100})
    book.progress(0, 3, T0)
    assert book.second_last_step_at(0) is None  # one step: nothing trained past yet
    book.progress(0, None, T0 + timedelta(seconds=1))  # a checkpoint save
    book.phase(0, "eval", "begin", T0 + timedelta(seconds=2), None)
    book.phase(0, "eval", "end", T0 + timedelta(seconds=3), None)
    book.progress(0, 3, T0 + timedelta(seconds=4))  # the same step line again
    assert book.second_last_step_at(0) is None
    book.progress(0, 4, T0 + timedelta(seconds=5))
    assert book.second_last_step_at(0) == T0
    book.progress(0, 5, T0 + timedelta(seconds=6))
    assert book.second_last_step_at(0) == T0 + timedelta(seconds=5)
    assert book.second_last_step_at(7) is None  # not a rank of this attempt


def test_a_survivor_of_an_in_process_restart_keeps_what_it_trained_past() -> None:
    """Walk-through 27: the book is reset at each in-process restart (a first step anew); a
    survivor that failed right after the second one had its error taken from a line it had
    trained 30 steps past, 19 s of training counted as detection."""
    book = LivenessBook()
    book.reset({0: 100, 1: 101})
    for k, step in enumerate((30, 31, 32)):
        book.progress(0, step, T0 + timedelta(seconds=k))
        book.progress(1, step, T0 + timedelta(seconds=k))
    book.reset({0: 100, 1: 202})  # rank 1 restarted as a new process, rank 0 re-enters
    assert book.second_last_step_at(0) == T0 + timedelta(seconds=1)  # the same process
    assert book.second_last_step_at(1) is None  # a new process: nothing of its own yet
    book.progress(0, 31, T0 + timedelta(seconds=5))  # its first step after the re-entry
    assert book.second_last_step_at(0) == T0 + timedelta(seconds=1)
    book.progress(0, 32, T0 + timedelta(seconds=6))
    assert book.second_last_step_at(0) == T0 + timedelta(seconds=5)


ILLEGAL = ("RuntimeError: CUDA error: an illegal memory access was encountered")


def test_a_progress_bar_redrawn_at_exit_does_not_hide_the_exception_it_died_of() -> None:
    """A tqdm bar never closed is redrawn at interpreter exit, after the fatal traceback,
    with a count above the last one drawn (a review of the first version): one new step
    after the exception, which is not two."""
    log = [stamped(4.0, "err", " 29%|##9       | 293/1000 [00:04<00:10]"),
           stamped(5.0, "err", "Traceback (most recent call last):"),
           stamped(5.0, "err", '  File "/work/train.py", line 7, in <module>'),
           stamped(5.0, "err", "    loss = model(batch)"),
           stamped(5.0, "err", ILLEGAL),
           stamped(7.5, "err", " 30%|###       | 301/1000 [00:07<00:11]")]
    d = verdict(T0 + timedelta(seconds=4), code=-6, log=log)  # a teardown abort, even
    assert d.category == Category.CUDA_KERNEL_ERROR, d
    # and a rank that exited by itself died of its last exception, whatever the steps say
    d = verdict(T0 + timedelta(seconds=7.5), code=1, log=log)
    assert d.category == Category.CUDA_KERNEL_ERROR, d
