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
from trainguard.diagnosis.survived import SURVIVED_BEFORE_STEP
from trainguard.diagnosis.taxonomy import Category, RestartHelps
from trainguard.diagnosis.verdict import diagnose
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


# -- a rank that recovered in place and said so (its own line in its own log) ------------------

GLOO = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed "
        "by peer [127.0.0.1]:12690")


def step_failed(seconds: float, step: int, generation: int) -> str:
    return stamped(seconds, "err", f"[trainguard.step] rank 0: step {step} failed on process "
                                   f"group generation {generation} ({GLOO})")


def recovered_log(mark: str) -> list[str]:
    """Step 4's collective error at 1.0 s, the rank's recovery line at 1.1 s, then step 8's
    error of the same kind at 1.5 s: all inside SURVIVED_BEFORE_STEP of each other (the toy's
    0.1 s steps: walk-through 34 #10)."""
    return [stamped(0.5, "out", "step 3 loss 0.300"),
            step_failed(1.0, 4, 0),
            stamped(1.1, "err", mark),
            stamped(1.2, "out", "step 5 loss 0.290"),
            stamped(1.3, "out", "step 7 loss 0.280"),
            step_failed(1.5, 8, 1)]


REEXECUTED = ("[trainguard.step] rank 0: step 4 re-executed on process group generation 1 "
              "(0.093s after it failed)")
RESTARTING = ("[trainguard.resilient] rank 0: restarting in place on process group generation "
              "1 (127.0.0.1:29400), torn down in 0.010s")
STARTED = ("[trainguard.resilient] rank 0: started in place of a failed process on process "
           "group generation 1")


def evidence_line(mark: str, second_last: datetime | None) -> int:
    d = verdict(second_last, code=1, log=recovered_log(mark))
    assert d.category == Category.NCCL_COMMUNICATION_ERROR, d
    assert d.evidence is not None
    return d.evidence.line


def test_a_failure_after_a_re_executed_step_is_named_by_its_own_line() -> None:
    """The re-executed step is proof by itself: step 8's line decides, not step 4's."""
    assert evidence_line(REEXECUTED, None) == 6
    assert evidence_line(REEXECUTED, T0 + timedelta(seconds=1.3)) == 6
    assert evidence_line("step 4 loss 0.310", T0 + timedelta(seconds=1.3)) == 2  # no mark


def test_a_restart_in_place_counts_once_the_rank_stepped_after_it() -> None:
    """A survivor's or a replacement's line counts when its second-last step came after it;
    a restart that failed before any step still shows the failure it was for."""
    for mark in (RESTARTING, STARTED):
        assert evidence_line(mark, T0 + timedelta(seconds=1.3)) == 6, mark
        assert evidence_line(mark, None) == 2, mark
        assert evidence_line(mark, T0 + timedelta(seconds=1.05)) == 2, mark  # a step before


def test_a_recovery_line_retires_only_its_own_ranks_earlier_lines() -> None:
    """Rank 1's recovery says nothing of rank 0's error in a shared console log."""
    log = [stamped(1.0, "err", f"[rank0]: {GLOO}"),
           stamped(1.1, "err", "[rank1]: " + REEXECUTED.replace("rank 0", "rank 1"))]
    findings = scan_lines(log, "console.log")
    (mark,) = [f for f in findings if f.recovered is not None]
    assert (mark.rank, mark.recovered) == (1, "re-executed")
    d = diagnose(findings, [RankExit(0, True, 1, T0 + timedelta(seconds=2))], load_rules())
    assert d is not None and d.evidence is not None and d.evidence.line == 1


def test_the_scan_reads_each_recovery_line_as_a_mark_not_a_failure() -> None:
    findings = scan_lines([stamped(1.1, "err", m) for m in (REEXECUTED, RESTARTING, STARTED)],
                          "rank-0.log", rank=0)
    assert [(f.rank, f.recovered, f.rule, f.exc_type) for f in findings] == [
        (0, "re-executed", None, None), (0, "re-entered", None, None),
        (0, "started", None, None)]
    # marks alone are no failure: a rank that exited 0 has nothing to diagnose
    assert diagnose(findings, [RankExit(0, False, 0)], load_rules()) is None


def test_in_a_log_without_rank_prefixes_any_ranks_recovery_retires_the_lines_before_it() -> None:
    """A line no rank prefix names could be any rank's: a recovery line after it retires it;
    a failure after the recovery line still decides."""
    log = [stamped(1.0, "err", GLOO),
           stamped(1.1, "err", REEXECUTED),
           stamped(1.5, "err", "RuntimeError: CUDA error: an illegal memory access was "
                               "encountered")]
    findings = scan_lines(log, "console.log")
    assert [f.rank for f in findings] == [None, 0, None]
    exits = [RankExit(0, True, 1, T0 + timedelta(seconds=2))]
    d = diagnose(findings, exits, load_rules())
    assert d is not None and d.category == Category.CUDA_KERNEL_ERROR, d
    d = diagnose(findings[:2], exits, load_rules())  # only what came before the recovery
    assert d is not None and d.evidence is None, d  # the exit alone: the line was retired


def test_a_replacement_of_a_replacement_retires_the_first_processs_failure() -> None:
    """Review 36 #1: rank 0 failed, was replaced, trained, was replaced again, and the second
    replacement failed within two steps (no second-last step of its own): the first process's
    error decided. A later recovery line of the rank shows the restart before it got on."""
    log = [stamped(1.0, "err", ILLEGAL), stamped(1.1, "err", STARTED),
           stamped(2.0, "err", STARTED.replace("generation 1", "generation 2")),
           stamped(2.2, "err", "FileNotFoundError: [Errno 2] No such file or directory: "
                               "'/ckpt/step-8/model.pt'")]
    d = verdict(None, code=1, log=log)
    assert d.evidence is not None and d.evidence.line == 4, d
    assert evidence_line(STARTED, None) == 2  # one restart line, no step after: it stays


def test_trainguards_own_console_copy_names_the_rank_and_its_recovery() -> None:
    """Review 36 #2: `trainguard run ... > job.out` (what a Slurm job keeps) prefixes every
    rank line with `[rank R] `; the recovery line was not read there, and `diagnose job.out`
    named step 4's line where step 8's failure ended the rank."""
    console = [f"[rank 1] {GLOO}",
               "[rank 1] " + REEXECUTED.replace("rank 0", "rank 1"),
               "[rank 0] step 6 loss 0.2",
               f"[rank 1] [rank1]: {GLOO.replace('step 4', 'step 8')}"]
    findings = scan_lines(console, "job.out")
    assert [(f.rank, f.recovered) for f in findings] == [
        (1, None), (1, "re-executed"), (1, None)], findings
    d = diagnose(findings, [RankExit(1, True, 1, T0 + timedelta(seconds=2))], load_rules())
    assert d is not None and d.evidence is not None and d.evidence.line == 4, d


def test_the_console_prefix_behind_srun_or_a_host_prefix_names_the_rank() -> None:
    """Review 39 #5: `srun -l`'s `0: ` before `[rank 3] ` was read as rank 0, a pdsh/clush
    host prefix before it was not read at all."""
    from trainguard.diagnosis.lines import split_prefix

    for line, node in (("0: [rank 3] RuntimeError: x", "0"),
                       ("node7: [rank 3] RuntimeError: x", "node7"),
                       ("1: [rank3]: RuntimeError: x", "1")):
        p = split_prefix(line)
        assert (p.rank, p.node, p.text) == (3, node, "RuntimeError: x"), (line, p)
