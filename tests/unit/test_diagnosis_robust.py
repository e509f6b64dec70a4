"""Whatever a log holds (binary garbage, invalid UTF-8, NULs, CRs, a 100 MB line, nothing at
all) and whatever the paths are (missing, a directory without logs, a socket, a .gz, a
truncated .gz), `trainguard diagnose` gives a diagnosis or a clear message, never a
traceback; and the scanner's findings do not depend on how the bytes were cut into chunks."""

from __future__ import annotations

import gzip
import socket
import time
import tracemalloc
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainguard.cli import main
from trainguard.diagnosis.candidates import RankExit
from trainguard.diagnosis.findings import Finding
from trainguard.diagnosis.lines import line_time, split_prefix
from trainguard.diagnosis.rules import load_rules
from trainguard.diagnosis.scan import compile_trigger, scan_bytes
from trainguard.diagnosis.sources import scan_file
from trainguard.diagnosis.verdict import diagnose

RULES = load_rules()
TRIGGER = compile_trigger(RULES)
SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

OOM_TRACEBACK = [
    b"[rank2]: Traceback (most recent call last):",
    b'[rank2]:   File "/workspace/train.py", line 88, in <module>',
    b"[rank2]:     main()",
    b'[rank2]:   File "/workspace/train.py", line 61, in main',
    b"[rank2]:     loss.backward()",
    b'[rank2]:   File "/usr/lib/python3.11/site-packages/torch/_tensor.py", line 522, in backward',
    b"[rank2]:     torch.autograd.backward(",
    b"[rank2]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 2 "
    b"has a total capacity of 79.15 GiB of which 1.06 GiB is free.",
]
OOM_TEXT = OOM_TRACEBACK[-1][len(b"[rank2]: "):].decode()

# pieces of real logs, to make random text that looks like logs (and breaks them)
PREFIXES = ["", "", "[rank0]: ", "[rank1]:", "[default1]:", "3: ", "[1,2]<stderr>:",
            "worker-1: [rank9]: ", "(RayTrainWorker pid=1, ip=10.0.0.1) ", "train_1  | ",
            "2025-03-01T12:00:00.123456+00:00 err ", "2025-03-01T12:00:00+00:00 out [rank1]: "]
FRAMES = ['  File "/workspace/train.py", line 61, in main', "    loss.backward()",
          '  File "/usr/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1, in f',
          "    ^^^^^^^^^^^^", "  [Previous line repeated 996 more times]", "",
          '  File "/w/ckpt.py", line 9, in load_checkpoint']
EXCEPTIONS = ["RuntimeError: CUDA error: an illegal memory access was encountered",
              "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
              "KeyError: 'x'", "ImportError: no apex, using native", "KeyboardInterrupt",
              "OSError: [Errno 28] No space left on device", "ValueError", "SystemExit: 1",
              "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970"]
LINES = ["step 14 loss 2.31", "Killed", "task 3: Killed", "exitcode: -9", "exitcode  : 1",
         "During handling of the above exception, another exception occurred:",
         "The above exception was the direct cause of the following exception:",
         "[E0301 12:00:20.000 140 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught "
         "collective operation timeout: WorkNCCL(SeqNum=5) ran for 600071 milliseconds",
         "2025-03-01 12:00:00,100 INFO step 1", "Mar  1 12:00:05 node3 kernel: Out of memory: "
         "Killed process 1234 (python)", "RuntimeError: Connection reset by peer",
         "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.", "", "   ", "\x00\x00"]
TOKENS = ["\r", "\x00", " ", "\t", ": ", "Error", "Exception", "Traceback (most recent call last):",
          "\ufffd", "é", "日本", "\U0001f525", "[rank", "]:", "File \"", "\n"]


@st.composite
def traceback_lines(draw: st.DrawFn) -> list[str]:
    """A Python traceback under one prefix; sometimes cut before its exception line."""
    prefix = draw(st.sampled_from(PREFIXES))
    body = draw(st.lists(st.sampled_from(FRAMES), max_size=6))
    end = draw(st.lists(st.sampled_from(EXCEPTIONS), max_size=1))
    return [prefix + ln for ln in ["Traceback (most recent call last):", *body, *end]]


@st.composite
def interleaved(draw: st.DrawFn, a: list[str], b: list[str]) -> list[str]:
    """a and b merged, each keeping its order (two ranks writing to one console)."""
    out, i, j = [], 0, 0
    while i < len(a) or j < len(b):
        if j >= len(b) or (i < len(a) and draw(st.booleans())):
            out.append(a[i])
            i += 1
        else:
            out.append(b[j])
            j += 1
    return out


one_line = st.one_of(
    st.tuples(st.sampled_from(PREFIXES), st.sampled_from(LINES + EXCEPTIONS)).map("".join),
    st.lists(st.one_of(st.sampled_from(TOKENS), st.text(max_size=8)), max_size=8).map("".join))
block = st.one_of(one_line.map(lambda ln: [ln]), traceback_lines(),
                  st.tuples(traceback_lines(), traceback_lines()).flatmap(
                      lambda ab: interleaved(*ab)))
log_text = st.builds(
    lambda blocks, nl, last: nl.join(ln for b in blocks for ln in b) + (nl if last else ""),
    st.lists(block, max_size=25), st.sampled_from(["\n", "\r\n"]), st.booleans())
log_bytes = st.one_of(
    log_text.map(lambda t: t.encode("utf-8")),
    st.lists(st.one_of(log_text.map(lambda t: t.encode("utf-8")), st.binary(max_size=16),
                       st.sampled_from([b"\xff", b"\xc3", b"\xe2\x82", b"\x00", b"\n"])),
             max_size=6).map(b"".join),
)
# a line of another stream than rank 2's (so it cannot end or continue rank 2's traceback)
garbage_line = st.binary(max_size=60).map(lambda b: b.replace(b"\n", b" ")).filter(
    lambda b: split_prefix(b.decode("utf-8", "replace")).rank != 2)
cut_points = st.lists(st.integers(min_value=0, max_value=10_000), max_size=12)


def scan(data: bytes, chunks: list[bytes] | None = None, name: str = "x.log") -> list[Finding]:
    return scan_bytes(RULES, TRIGGER, name, [data] if chunks is None else chunks)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    """data cut at the given points (ten-thousandths of its length)."""
    points = sorted({c * len(data) // 10_000 for c in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in pairwise(bounds)]


def sane(findings: list[Finding], data: bytes) -> None:
    lines = data.count(b"\n") + 1
    offsets = [f.offset for f in findings]
    for f in findings:
        assert 1 <= f.line <= lines
        assert 0 <= f.offset < max(len(data), 1)
        # the offset is the start of line `line`
        assert data.count(b"\n", 0, f.offset) == f.line - 1
        assert f.offset == 0 or data[f.offset - 1:f.offset] == b"\n"
    assert len(set(offsets)) == len(offsets)  # one finding per line


# --- properties --------------------------------------------------------------------------


@SETTINGS
@given(st.binary(max_size=4096))
def test_arbitrary_bytes_scan_and_diagnose_without_error(data: bytes) -> None:
    found = scan(data)
    sane(found, data)
    diagnose(found, [RankExit(0, True, -9)], RULES)


@SETTINGS
@given(log_bytes)
def test_log_like_text_with_garbage_scans_and_diagnoses_without_error(data: bytes) -> None:
    found = scan(data)
    sane(found, data)
    d = diagnose(found, [], RULES)
    assert d is None or d.summary


@SETTINGS
@given(log_bytes, cut_points)
def test_the_findings_do_not_depend_on_how_the_bytes_are_chunked(
        data: bytes, cuts: list[int]) -> None:
    assert scan(data, split(data, cuts)) == scan(data)


@SETTINGS
@given(log_bytes, st.integers(min_value=1, max_value=64))
def test_the_findings_do_not_depend_on_the_chunk_size(data: bytes, size: int) -> None:
    chunks = [data[i:i + size] for i in range(0, len(data), size)]
    assert scan(data, chunks) == scan(data)


@SETTINGS
@given(st.lists(garbage_line, min_size=1, max_size=30),
       st.lists(st.integers(min_value=0, max_value=len(OOM_TRACEBACK) + 30), min_size=1),
       cut_points)
def test_an_oom_traceback_interleaved_with_garbage_is_still_found(
        garbage: list[bytes], where: list[int], cuts: list[int]) -> None:
    lines = list(OOM_TRACEBACK)
    for g, w in zip(garbage, where, strict=False):
        lines.insert(min(w, len(lines) - 1), g)  # before the exception line at the latest
    data = b"\n".join(lines) + b"\n"
    found = scan(data, split(data, cuts))
    oom = [f for f in found if f.rule == "cuda-oom"]
    assert len(oom) == 1
    assert oom[0].rank == 2 and oom[0].text == OOM_TEXT and oom[0].traceback
    assert oom[0].frame == "/workspace/train.py:61 in main"
    assert oom[0].line == lines.index(OOM_TRACEBACK[-1]) + 1
    d = diagnose(found, [], RULES)
    assert d is not None and d.culprit.rank == 2


@SETTINGS
@given(st.text(max_size=300))
def test_prefix_and_time_parsing_take_any_text(text: str) -> None:
    pre = split_prefix(text)
    assert pre.text in text
    line_time(pre.text, None)
    line_time(pre.text, 2025)


# --- big, empty, binary ------------------------------------------------------------------


def write_huge_line(path: Path, mib: int) -> None:
    block = (bytes(range(32, 127)) + b" CUDA_Error x" * 8) * 1024
    block = (block * (1 + (1 << 20) // len(block)))[:1 << 20]  # 1 MiB, no newline
    with path.open("wb") as fh:
        for _ in range(mib):
            fh.write(block)
        fh.write(b"\nRuntimeError: CUDA error: an illegal memory access was encountered\n")


def test_a_100_mb_line_is_cut_and_the_error_after_it_is_found_fast_in_bounded_memory(
        tmp_path: Path) -> None:
    path = tmp_path / "rank-0.log"
    write_huge_line(path, 100)
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        found = scan_file(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    elapsed = time.monotonic() - t0
    [f] = found
    assert (f.line, f.exc_type, f.rank) == (2, "RuntimeError", 0)
    assert f.offset == (100 << 20) + 1
    assert peak < 40 << 20, f"peak {peak >> 20} MiB"  # a few 8 MiB chunks, not the line
    assert elapsed < 10


def test_the_same_huge_line_fed_in_one_piece_gives_the_same_finding(tmp_path: Path) -> None:
    path = tmp_path / "big.log"
    write_huge_line(path, 3)
    data = path.read_bytes()
    assert scan(data) == scan(data, [data[i:i + (1 << 20)] for i in range(0, len(data), 1 << 20)])


def cli(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    code = main(["diagnose", *map(str, args)])
    out, err = capsys.readouterr()
    assert code in (0, 1, 2)
    assert "Traceback (most recent call last)" not in out + err
    return code, out, err


OOM_LINE = b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"


@pytest.mark.parametrize("content", [b"", b"\x00" * 65536, b"\n" * 1000, b"\r" * 1000,
                                     bytes(range(256)) * 64, b"\xff\xfe" * 5000])
def test_a_log_with_nothing_to_find_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes) -> None:
    path = tmp_path / "rank-0.log"
    path.write_bytes(content)
    code, out, _ = cli(capsys, path)
    assert code == 1 and "no failure found" in out and "read 1 file(s)" in out


def test_invalid_utf8_around_an_exception_line_still_diagnoses(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "rank-3.log"
    path.write_bytes(b"\xff\xfe\xc3(step 1\n\xe2\x82" + b"\x00" * 10 + b"\n" + OOM_LINE
                     + b"\xc3\x28\xa0\xa1\n\xf0\x28\x8c\xbc")
    code, out, _ = cli(capsys, path, "--json")
    assert code == 0 and '"category": "gpu_oom"' in out and '"line": 3' in out
    code, out, _ = cli(capsys, path)
    assert code == 0 and out.startswith("gpu_oom") and "rank 3" in out


def test_a_traceback_after_garbage_on_the_header_line_keeps_its_exception_text(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "console.log"
    path.write_bytes(b"\xff\xfe\xc3(Traceback (most recent call last):\n"
                     b'  File "/w/t.py", line 1, in <module>\n\xe2\x82' + OOM_LINE)
    code, out, _ = cli(capsys, path)
    assert code == 0 and "torch.OutOfMemoryError: CUDA out of memory" in out


def test_a_giant_rank_number_or_exit_code_is_just_text(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """int() refuses more than 4300 digits: such a run must not reach it."""
    path = tmp_path / "console.log"
    path.write_text(f"[rank{'9' * 5000}]: RuntimeError: boom\nexitcode: -{'9' * 5000}\n"
                    f"task {'1' * 5000}: Killed\n[1,{'2' * 5000}]<stderr>: KeyError: 'x'\n")
    code, _, _ = cli(capsys, path)
    assert code == 0


def test_a_directory_without_logs_is_a_clear_usage_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "logs"
    d.mkdir()
    (d / "trainguard.yaml").write_text("x: 1\n")  # not a log
    (d / ".hidden.log").write_bytes(OOM_LINE)
    code, _, err = cli(capsys, d)
    assert code == 2 and "no log files" in err and str(d) in err


def test_a_missing_path_is_a_clear_usage_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(capsys, tmp_path / "nope.log")
    assert code == 2 and "no such file or directory" in err


def test_a_dangling_symlink_is_named_and_the_other_logs_are_still_read(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    link = tmp_path / "rank-1.log"
    link.symlink_to(tmp_path / "gone" / "rank-1.log")
    good = tmp_path / "rank-0.log"
    good.write_bytes(OOM_LINE)
    code, _, err = cli(capsys, link)
    assert code == 2 and str(link) in err
    code, out, err = cli(capsys, good, link)
    assert code == 0 and out.startswith("gpu_oom") and f"warning: {link}" in err


@pytest.fixture
def unreadable(tmp_path: Path) -> Iterator[Path]:
    """A path that exists but that even root cannot open for reading (a Unix socket)."""
    path = tmp_path / "rank-2.log"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    try:
        yield path
    finally:
        sock.close()


def test_a_path_that_cannot_be_opened_is_named_with_the_reason(
        tmp_path: Path, unreadable: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(capsys, unreadable)
    assert code == 2 and "cannot read it" in err and str(unreadable) in err
    good = tmp_path / "rank-0.log"
    good.write_bytes(OOM_LINE)
    code, out, err = cli(capsys, good, unreadable)
    assert code == 0 and "gpu_oom" in out and "cannot read it" in err


def test_a_directory_named_like_a_log_is_walked(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "rank-0.log"
    d.mkdir()
    (d / "stderr").write_bytes(OOM_LINE)
    code, out, _ = cli(capsys, d)
    assert code == 0 and out.startswith("gpu_oom")


def test_a_gzipped_log_is_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "rank-4.log.gz"
    path.write_bytes(gzip.compress(b"step 1\n" * 1000 + OOM_LINE))
    code, out, _ = cli(capsys, path)
    assert code == 0 and out.startswith("gpu_oom") and "rank 4" in out
    assert f"{path}:1001" in out


def test_a_file_named_gz_that_is_not_gzip_is_a_clear_message(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "rank-4.log.gz"
    path.write_bytes(OOM_LINE)
    code, _, err = cli(capsys, path)
    assert code == 2 and str(path) in err and "cannot read it" in err


@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_a_damaged_gzipped_log_is_a_clear_message(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str) -> None:
    whole = gzip.compress(b"step 1\n" * 20000 + OOM_LINE + b"step 2\n" * 20000)
    path = tmp_path / "rank-4.log.gz"
    if damage == "truncated":
        path.write_bytes(whole[:len(whole) // 2])
    else:
        path.write_bytes(whole[:40] + bytes(b ^ 0x5A for b in whole[40:80]) + whole[80:])
    _, _, err = cli(capsys, path)
    assert str(path) in err


def test_a_rules_file_with_a_pattern_re2_cannot_run_still_works(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "version: 1\nrules:\n"
        "  - id: lookahead\n    category: config_error\n    domain: user_code\n"
        '    restart: "no"\n'
        "    pattern: 'bad config(?= in)'\n    advice: Fix the config.\n")
    log = tmp_path / "rank-0.log"
    log.write_bytes(b"step 1\nerror: bad config in train.yaml\n")
    code, out, err = cli(capsys, log, "--rules", rules)
    # run by Python's re, or refused with a message that names the problem
    assert (code == 0 and out.startswith("config_error")) or (code == 2 and "RE2" in err)


def test_usage_mistakes_are_clear_messages(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "rank-0.log"
    log.write_bytes(OOM_LINE)
    code, _, err = cli(capsys, log, "--rules", tmp_path / "none.yaml")
    assert code == 2 and "cannot read the rules file" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nrules: [{id: X}]\n")
    code, _, err = cli(capsys, log, "--rules", bad)
    assert code == 2 and "rule" in err
    code, out, _ = cli(capsys, log, "--attempt", "3")  # no job dir: the logs are still read
    assert code == 0 and out.startswith("gpu_oom")


def test_a_log_file_name_that_is_not_utf8_is_printed_without_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "logs"
    d.mkdir()
    name = (d / "rank-0\udcff.log")  # the name b"rank-0\xff.log" on disk
    name.write_bytes(OOM_LINE)
    code, out, _ = cli(capsys, d)
    assert code == 0 and out.startswith("gpu_oom")
