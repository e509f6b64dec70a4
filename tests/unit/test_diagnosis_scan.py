"""The log scanner and the cross-rank verdict on realistic multi-rank text: launcher and rank
prefixes, timestamps, tracebacks (chained, interleaved, cut, across a chunk boundary), tails,
and the root cause across ranks. The real rules (rules.yaml) throughout."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from itertools import pairwise
from pathlib import Path

import pytest

from trainguard.diagnosis.candidates import RankExit
from trainguard.diagnosis.findings import Finding
from trainguard.diagnosis.rules import load_rules
from trainguard.diagnosis.scan import compile_trigger, scan_bytes
from trainguard.diagnosis.sources import CHUNK, scan_file
from trainguard.diagnosis.taxonomy import Category, Diagnosis
from trainguard.diagnosis.verdict import diagnose

RULES = load_rules()
TRIGGER = compile_trigger(RULES)
T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=timezone.utc)

OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 2 has a "
       "total capacity of 79.15 GiB of which 1.06 GiB is free. Of the allocated memory 75.2 GiB "
       "is allocated by PyTorch")
WATCHDOG = ("[E0301 12:00:20.000000 140 ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught "
            "collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1, "
            "NumelOut=1, Timeout(ms)=600000) ran for 600071 milliseconds before timing out.")
GLOO_RESET = ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:"
              "534] Connection reset by peer")


def oom_traceback() -> list[str]:
    """What torch prints when backward runs out of GPU memory (8 lines, exception last)."""
    return [
        "Traceback (most recent call last):",
        '  File "/workspace/train.py", line 88, in <module>',
        "    main()",
        '  File "/workspace/train.py", line 61, in main',
        "    loss.backward()",
        '  File "/usr/local/lib/python3.11/site-packages/torch/_tensor.py", line 522, in backward',
        "    torch.autograd.backward(",
        OOM,
    ]


def scan(lines: Sequence[str] | bytes, name: str = "console.log",
         chunks: Sequence[int] = ()) -> list[Finding]:
    """Findings of the lines (joined with newlines), fed whole or split at `chunks` offsets."""
    data = lines if isinstance(lines, bytes) else "".join(f"{ln}\n" for ln in lines).encode()
    cuts = [0, *chunks, len(data)]
    return scan_bytes(RULES, TRIGGER, name, [data[a:b] for a, b in pairwise(cuts)])


def exceptions(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.exc_type is not None]


def stamp(t: datetime, text: str, stream: str = "err") -> str:
    """A line as trainguard's log router writes it: `<ISO time> <out|err> <text>`."""
    return f"{t.isoformat()} {stream} {text}"


# --- prefixes ------------------------------------------------------------------------------


@pytest.mark.parametrize(("prefix", "rank", "node"), [
    ("[rank3]: ", 3, None),  # torchrun --log-line-prefix / torch >= 2.2 default
    ("[rank3]:", 3, None),
    ("[default3]:", 3, None),  # torchrun --tee
    ("3: ", 3, None),  # srun -l
    ("  3: ", 3, None),  # srun -l pads the task id
    ("[1,3]<stderr>:", 3, None),  # mpirun --tag-output
    ("worker-1: [rank9]: ", 9, "worker-1"),  # pdsh / DeepSpeed launcher
    ("(RayTrainWorker pid=123, ip=10.0.0.1) ", None, "10.0.0.1"),  # Ray actors
    ("[1830] [rank3]: ", 3, None),  # line numbers an issue tracker adds to a paste
])
def test_a_traceback_under_a_launcher_prefix_is_parsed_with_its_rank_and_node(
        prefix: str, rank: int | None, node: str | None) -> None:
    found = scan(["step 14 loss 2.31", *(prefix + ln for ln in oom_traceback())])
    [f] = exceptions(found)
    assert (f.rank, f.node, f.line) == (rank, node, 9)
    assert f.text == OOM  # the prefix is gone from the text
    assert f.exc_type == "torch.OutOfMemoryError" and f.rule == "cuda-oom"
    assert f.traceback and f.final
    assert f.frame == "/workspace/train.py:61 in main"  # the deepest frame in user code
    assert f.library_frame  # ...raised inside torch


def test_trainguards_stamp_gives_each_line_its_time_and_is_stripped() -> None:
    lines = [stamp(T0 + timedelta(seconds=i), f"[rank2]: {ln}")
             for i, ln in enumerate(oom_traceback())]
    [f] = scan(lines)
    assert f.text == OOM and f.rank == 2 and f.traceback
    assert f.at == T0 + timedelta(seconds=7) and not f.at_inherited  # the exception line's


def test_the_file_name_gives_the_rank_of_unprefixed_lines() -> None:
    [f] = scan(oom_traceback(), name="logs/attempt-0/rank-5.log")
    assert f.rank == 5
    [g] = scan(["[rank2]: " + OOM], name="logs/attempt-0/rank-5.log")
    assert g.rank == 2  # a prefix in the line wins over the file name


# --- the prefilter -------------------------------------------------------------------------


def test_a_bare_killed_line_is_found_anywhere_in_a_chunk() -> None:
    """A rule anchored to the line (`^Killed$`) must not be anchored to the chunk."""
    found = scan(["step 1 loss 2.3", "Killed", "step 2", "[rank3]: Killed",
                  "2025-03-01T12:00:00+00:00 err Killed"])
    assert [(f.line, f.rank, f.rule) for f in found] == [
        (2, None, "shell-killed"), (4, 3, "shell-killed"), (5, None, "shell-killed")]


def test_no_prefilter_hit_runs_over_a_line_break() -> None:
    """`\\d+ Killed\\s+\\S` must not swallow the start of the next line (and its hit); the
    shell's job notice is an exit notice of its own (SIGKILL), with no rule."""
    found = scan(["bash: line 1: 4242 Killed", "CUDA out of memory. Tried to allocate 2.00 GiB"])
    assert [(f.line, f.rule, f.returncode) for f in found] == [(1, None, -9),
                                                               (2, "cuda-oom", None)]


@pytest.mark.parametrize("line", ["OSError: [Errno 24] Too many open files",
                                  "IOError: [Errno 9] Bad file descriptor",
                                  "EOFError: marshal data too short"])
def test_a_standalone_exception_named_in_capitals_is_found(line: str) -> None:
    [f] = scan(["step 1", line, "step 2"])
    assert (f.line, f.exc_type) == (2, line.split(":")[0])


# --- timestamps ------------------------------------------------------------------------------


def test_glog_lines_take_the_year_of_the_last_iso_time_and_untimed_lines_inherit() -> None:
    found = scan([
        WATCHDOG.format(r=0),  # glog before any ISO time: no year, so no time
        "2025-03-01 12:00:00,100 INFO train.py:10 step 1 loss 2.31",  # not read: no error
        WATCHDOG.format(r=0),
        "[2025-03-01 12:00:10,000] [WARNING] [comm.py:12] NCCL WARN Connection reset by peer",
        WATCHDOG.format(r=0),
        "RuntimeError: NCCL communicator was aborted on rank 0.",
    ])
    first, second, reset, third, last = found
    # the year comes from the lines the scanner reads (those with something to find)
    assert first.at is None and second.at is None and first.rule == "collective-timeout"
    assert reset.at == datetime(2025, 3, 1, 12, 0, 10, tzinfo=timezone.utc)
    assert third.at == datetime(2025, 3, 1, 12, 0, 20, tzinfo=timezone.utc)
    assert not third.at_inherited
    assert last.at == third.at and last.at_inherited  # no time of its own
    assert [f.line for f in found] == [1, 3, 4, 5, 6]


def test_an_iso_time_inside_a_logger_prefix_is_the_lines_time() -> None:
    [f] = scan(["[2025-03-01 12:00:07,500] [ERROR] [engine.py:12:step] RuntimeError: CUDA error: "
                "an illegal memory access was encountered"])
    assert f.at == datetime(2025, 3, 1, 12, 0, 7, 500000, tzinfo=timezone.utc)
    assert f.exc_type == "RuntimeError"


def test_an_impossible_date_is_no_time_and_no_error() -> None:
    [f] = scan(["2025-02-31 25:61:00 RuntimeError: CUDA error: an illegal memory access"])
    assert f.at is None and f.exc_type == "RuntimeError"


# --- tracebacks ------------------------------------------------------------------------------


def test_chained_exceptions_share_a_chain_and_the_last_chain_is_final() -> None:
    p = "[rank0]: "
    found = scan([p + ln for ln in [
        # a caught error, logged and survived: not what the process died of
        "Traceback (most recent call last):",
        '  File "/workspace/data.py", line 40, in load',
        "FileNotFoundError: [Errno 2] No such file or directory: 'cache/shard-3.pt'",
        "step 1 loss 2.3",
        # the chain the process died of
        "Traceback (most recent call last):",
        '  File "/workspace/train.py", line 30, in step',
        "    batch = batches[key]",
        "KeyError: 'input_ids'",
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        "Traceback (most recent call last):",
        '  File "/workspace/train.py", line 33, in step',
        "    raise ValueError(f'bad batch {key}') from None",
        "ValueError: bad batch input_ids",
        "",
        "The above exception was the direct cause of the following exception:",
        "",
        "Traceback (most recent call last):",
        '  File "/workspace/train.py", line 90, in <module>',
        "    main()",
        "RuntimeError: step 2 failed",
    ]])
    excs = {f.exc_type: f for f in exceptions(found)}
    assert list(excs) == ["FileNotFoundError", "KeyError", "ValueError", "RuntimeError"]
    assert all(f.traceback and f.rank == 0 for f in excs.values())
    assert not excs["FileNotFoundError"].final
    assert excs["KeyError"].chain == excs["ValueError"].chain == excs["RuntimeError"].chain
    assert excs["KeyError"].chain != excs["FileNotFoundError"].chain
    assert all(excs[t].final for t in ("KeyError", "ValueError", "RuntimeError"))
    assert [excs[t].line for t in excs] == [3, 8, 15, 22]
    assert excs["ValueError"].frame == "/workspace/train.py:33 in step"


def test_the_chain_marker_of_one_rank_does_not_chain_another_ranks_exception() -> None:
    found = scan([
        "[rank0]: KeyError: 'a'",
        "[rank0]: During handling of the above exception, another exception occurred:",
        "[rank1]: ValueError: b",
        "[rank0]: RuntimeError: c",
    ])
    chains = {f.exc_type: (f.rank, f.chain, f.final) for f in found}
    assert chains == {"KeyError": (0, 1, True), "RuntimeError": (0, 1, True),
                      "ValueError": (1, 1, True)}


def test_a_traceback_interleaved_with_another_ranks_lines_keeps_both() -> None:
    tb = oom_traceback()
    lines = []
    for i, ln in enumerate(tb):
        lines.append(f"[rank2]: {ln}")
        if i == 2:
            lines.append("[rank1]: " + WATCHDOG.format(r=1))
        elif i == 4:
            lines.append(f"[rank3]: {GLOO_RESET}")
        else:
            lines.append(f"[rank1]: step 14 loss 2.31 lr {i}e-4")
    found = scan(lines)
    oom = next(f for f in found if f.rule == "cuda-oom")
    assert (oom.rank, oom.line, oom.traceback) == (2, 15, True)
    assert oom.frame == "/workspace/train.py:61 in main"
    watchdog = next(f for f in found if f.rule == "collective-timeout")
    assert (watchdog.rank, watchdog.line) == (1, 6)
    reset = next(f for f in found if f.rule == "peer-gone")
    assert (reset.rank, reset.line, reset.exc_type) == (3, 10, "RuntimeError")
    assert len(found) == 3


def test_tracebacks_of_ranks_failing_at_once_interleave_and_each_is_parsed() -> None:
    """All ranks run out of memory at the same step and write one console line by line."""
    lines = [f"[rank{r}]: {ln}" for ln in oom_traceback() for r in (0, 1, 2, 3)]
    found = scan(lines)
    assert [(f.rank, f.line) for f in found] == [(r, 29 + r) for r in range(4)]
    assert all(f.traceback and f.final and f.frame == "/workspace/train.py:61 in main"
               for f in found)
    data = "".join(f"{ln}\n" for ln in lines).encode()
    assert all(scan(data, chunks=[k]) == found for k in range(0, len(data), 97))


def test_lines_after_a_traceback_cut_before_its_exception_are_still_scanned() -> None:
    found = scan([
        "Traceback (most recent call last):",
        '  File "/workspace/train.py", line 61, in main',
        "    loss.backward()",
        # (the paste was cut here: no exception line)
        "step 12 loss 2.30",
        "warning: saving checkpoint failed: [Errno 28] No space left on device",
        "Traceback (most recent call last):",
        '  File "/workspace/data.py", line 12, in load',
        "    return torch.load(path)",
        "FileNotFoundError: [Errno 2] No such file or directory: '/ckpt/step_12.pt'",
        "step 13 loss 2.29",
    ])
    disk, missing = found
    assert (disk.line, disk.rule, disk.exc_type) == (5, "disk-full", None)
    assert (missing.line, missing.exc_type, missing.traceback) == (9, "FileNotFoundError", True)
    assert missing.frame == "/workspace/data.py:12 in load"  # not the cut traceback's frames


def test_a_traceback_cut_at_the_end_of_the_file_leaves_the_lines_after_its_header() -> None:
    found = scan([
        "Traceback (most recent call last):",
        '  File "/workspace/train.py", line 61, in main',
        "    loss.backward()",
        "srun: error: gpu-node-3: task 3: Killed",
    ])
    [f] = found
    assert (f.line, f.returncode, f.rank) == (4, -9, 3)
    assert scan(oom_traceback()[:5]) == []  # header and frames only: nothing, no error


def test_a_traceback_whose_exception_is_the_last_line_without_a_newline_is_parsed() -> None:
    data = "\n".join(oom_traceback()).encode()
    [f] = scan(data)
    assert f.traceback and f.line == 8 and f.frame == "/workspace/train.py:61 in main"


def test_an_exception_after_garbage_on_the_header_line_is_read_whole() -> None:
    """Bytes before the header (a broken paste) are not a prefix every line repeats."""
    data = b"\xff\xfe\xc3(Traceback (most recent call last):\n" + "\n".join(
        oom_traceback()[1:]).encode() + b"\n"
    [f] = scan(data)
    assert f.text == OOM and f.exc_type == "torch.OutOfMemoryError"


def test_a_logger_prefix_repeated_on_every_traceback_line_is_cut() -> None:
    pre = "train_1  | "  # docker compose
    [f] = scan([pre + ln for ln in oom_traceback()])
    assert f.text == OOM and f.traceback and f.frame == "/workspace/train.py:61 in main"


def filler(size: int, start_line: int = 1) -> tuple[bytes, int]:
    """Training noise of exactly `size` bytes (whole lines), with a peer-reset line now and
    then; returns it and the number of lines."""
    out, n, total = [], 0, 0
    while total < size:
        i = start_line + n
        ln = (f"[rank1]: {GLOO_RESET}\n" if i % 20_000 == 0 else
              f"[rank0]: step {i} loss 2.{i % 97:02d} lr 1.0e-4 tokens/s 91234 mfu 0.41\n")
        if total + len(ln) > size:
            ln = "x" * (size - total - 1) + "\n"
        out.append(ln)
        total += len(ln)
        n += 1
    return "".join(out).encode(), n


@pytest.mark.parametrize("back", [60, 3_000, 99_000])
def test_a_traceback_across_a_chunk_boundary_is_parsed_as_if_read_whole(back: int) -> None:
    """The header sits `back` bytes before the end of an 8 MiB chunk; its frames (long code
    lines) run into the next chunk."""
    head, n = filler(CHUNK - back)
    tb = oom_traceback()
    frames = [ln for i in range(80) for ln in (
        f'  File "/workspace/model.py", line {100 + i}, in block_{i}',
        f"    x = self.layer_{i}(x, {'mask, ' * 250}cache)")]
    body = "".join(f"[rank2]: {ln}\n" for ln in [tb[0], *frames, *tb[1:]]).encode()
    assert len(body) > back  # it does cross the boundary
    tail, _ = filler(200_000, start_line=n + 168)
    data = head + body + tail
    whole = scan(data)
    assert scan(data, chunks=[CHUNK]) == whole
    assert scan(data, chunks=[CHUNK, CHUNK + 100_000]) == whole
    oom = next(f for f in whole if f.rule == "cuda-oom")
    assert oom.traceback and oom.rank == 2 and oom.line == n + 168
    assert oom.frame == "/workspace/train.py:61 in main"
    resets = [f for f in whole if f.rule == "peer-gone"]
    assert [f.line for f in resets] == [20_000 * k for k in range(1, len(resets) + 1)]


# --- scan_file: tails ------------------------------------------------------------------------


def test_a_tail_scan_keeps_true_line_numbers_and_offsets(tmp_path: Path) -> None:
    lines = [f"step {i} loss 2.31" for i in range(1, 1001)]
    lines[989] = OOM  # line 990
    lines[969] = GLOO_RESET  # line 970: before the tail
    path = tmp_path / "rank-2.log"
    data = "".join(f"{ln}\n" for ln in lines).encode()
    path.write_bytes(data)
    whole = scan_file(path)
    assert [f.line for f in whole] == [970, 990]
    start_of_985 = data.index(b"step 985 ")
    for tail in (len(data) - start_of_985 - 3, len(data) - start_of_985 + 5):  # mid-line cuts
        [f] = scan_file(path, tail_bytes=tail)
        assert (f.line, f.offset, f.text, f.rule) == (990, whole[1].offset, OOM, "cuda-oom")
    assert scan_file(path, tail_bytes=len(data) * 2) == whole


def test_a_tail_that_starts_exactly_at_a_line_keeps_that_line(tmp_path: Path) -> None:
    path = tmp_path / "rank-2.log"
    data = b"step 1\nstep 2\n" + OOM.encode() + b"\nstep 4\n"
    path.write_bytes(data)
    [f] = scan_file(path, tail_bytes=len(data) - data.index(b"torch."))
    assert (f.line, f.text) == (3, OOM)


# --- verdicts across ranks -------------------------------------------------------------------


def rank_logs(logs: dict[int, list[str]]) -> list[Finding]:
    found: list[Finding] = []
    for rank, lines in logs.items():
        found += scan(lines, name=f"logs/attempt-0/rank-{rank}.log")
    return found


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_the_rank_that_ran_out_of_memory_first_is_the_culprit_and_the_watchdogs_symptoms(
) -> None:
    logs = {2: [stamp(at(1), "step 14 loss 2.31", "out"),
                *(stamp(at(10), ln) for ln in oom_traceback())]}
    for r in (0, 1, 3):
        logs[r] = [stamp(at(1), "step 14 loss 2.31", "out"),
                   stamp(at(20), f"[rank{r}]:" + WATCHDOG.format(r=r)),
                   stamp(at(20.5), f"[rank{r}]: terminate called after throwing an instance of "
                                   "'c10::DistBackendError'")]
    exits = [RankExit(2, True, 1, at(11)),
             *(RankExit(r, True, -6, at(21)) for r in (0, 1, 3))]
    d = diagnose(rank_logs(logs), exits, RULES)
    assert d is not None
    assert d.category == Category.GPU_OOM and d.culprit.rank == 2
    assert d.culprit.frame == "/workspace/train.py:61 in main"
    assert d.evidence is not None and d.evidence.text == OOM and d.evidence.line == 9
    watchdog = [s for s in d.symptoms if "Watchdog caught collective operation timeout" in s.text]
    assert len(watchdog) == 1 and watchdog[0].count == 3


def killed_rank_verdict(oom_killed: bool | None, rank1_log: Sequence[str]) -> Diagnosis:
    logs = {0: ["step 7 loss 1.0", GLOO_RESET], 1: list(rank1_log),
            2: ["step 7 loss 1.0", GLOO_RESET.replace("534", "537")]}
    exits = [RankExit(1, True, -9, at(5), oom_killed),
             RankExit(0, True, 1, at(6)), RankExit(2, True, 1, at(6))]
    d = diagnose(rank_logs(logs), exits, RULES)
    assert d is not None
    return d


@pytest.mark.parametrize(("oom_killed", "category"), [
    (True, Category.HOST_OOM),
    (False, Category.KILLED_BY_SIGNAL_UNKNOWN),
    (None, Category.HOST_OOM),  # no OOM-kill count: SIGKILL is most likely the OOM killer
])
def test_a_sigkilled_rank_beats_the_connection_resets_it_caused(
        oom_killed: bool | None, category: Category) -> None:
    d = killed_rank_verdict(oom_killed, ["step 7 loss 1.0"])
    assert d.category == category and d.culprit.rank == 1
    resets = [s for s in d.symptoms if "Connection reset by peer" in s.text]
    assert resets and resets[0].count == 2


@pytest.mark.parametrize("oom_killed", [True, False, None])
def test_a_stray_import_warning_in_a_sigkilled_rank_is_not_the_cause(
        oom_killed: bool | None) -> None:
    d = killed_rank_verdict(oom_killed, ["ImportError: no apex, using native",
                                         "step 6 loss 1.1", "step 7 loss 1.0"])
    assert d.category != Category.DEPENDENCY_OR_IMPORT_ERROR
    assert d.category in (Category.HOST_OOM, Category.KILLED_BY_SIGNAL_UNKNOWN)


def test_an_import_warning_inside_a_line_is_only_a_hint_next_to_a_sigkill() -> None:
    d = killed_rank_verdict(False, ["warning: fused kernels unavailable (ImportError: No module "
                                    "named 'apex'), using native", "step 7 loss 1.0"])
    assert d.category == Category.KILLED_BY_SIGNAL_UNKNOWN


def test_lines_written_after_the_failure_was_detected_are_not_evidence() -> None:
    logs = {1: [stamp(at(20), "[rank1]:" + WATCHDOG.format(r=1))],
            0: [stamp(at(30), ln) for ln in oom_traceback()]}  # 5 s after detection
    findings = rank_logs(logs)
    exits = [RankExit(1, True, -6, at(21)), RankExit(0, False, -15, at(31))]
    late = diagnose(findings, exits, RULES, detected_at=at(25))
    assert late is not None and late.category == Category.NCCL_TIMEOUT_OR_HANG
    assert all(OOM not in s.text for s in late.symptoms)
    whole = diagnose(findings, exits, RULES)
    assert whole is not None and whole.category == Category.GPU_OOM
