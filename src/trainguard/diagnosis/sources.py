"""Where findings come from: log files and directories of logs. I/O (reads files only).

`scan_file` is what a node agent runs on its ranks' logs after a failure; `diagnose_paths`
is what `trainguard diagnose` runs, with the CLI's reader of job dirs (cli/diagnose_job.py:
the job store, its attempt logs and hang verdict). Both end in verdict.diagnose.
"""

from __future__ import annotations

import codecs
import io
import os
import re
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import BinaryIO, cast

from trainguard.diagnosis.candidates import RankExit
from trainguard.diagnosis.context import CONTEXT_LINES
from trainguard.diagnosis.findings import Finding
from trainguard.diagnosis.lines import file_rank
from trainguard.diagnosis.lost import loss_summary, node_loss_diagnosis
from trainguard.diagnosis.prefilter import Trigger, compile_trigger
from trainguard.diagnosis.rules import RuleSet, load_rules
from trainguard.diagnosis.scan import FileScan, scan_bytes
from trainguard.diagnosis.silent_peer import silent_peer
from trainguard.diagnosis.taxonomy import Diagnosis
from trainguard.diagnosis.verdict import diagnose
from trainguard.errors import DiagnoseError
from trainguard.paths import STACKS_DIR

CHUNK = 8 << 20
_ATTEMPT_DIR = re.compile(r"attempt-\d+$")  # paths.attempt_log_dir's name
SKIP_SUFFIXES = (".db", ".db-wal", ".db-shm", ".yaml", ".yml", ".json", ".lock", ".pt", ".pth",
                 ".safetensors", ".bin", ".npy", ".npz", ".pkl")


@cache
def default_trigger() -> Trigger:
    return compile_trigger(load_rules())


def trigger_for(rules: RuleSet) -> Trigger:
    """The shipped rules' trigger is compiled once per process; other rules' each call."""
    return default_trigger() if rules is load_rules() else compile_trigger(rules)


def scan_lines(lines: Iterable[str], name: str, rank: int | None = None) -> list[Finding]:
    """Findings of some lines already in memory (a tail kept by the log router, tests);
    `rank`, when given, owns every line."""
    data = "".join(f"{ln}\n" for ln in lines).encode("utf-8", "replace")
    return scan_bytes(load_rules(), default_trigger(), name, [data], default_rank=rank,
                      force_rank=rank is not None)


def _chunks(fh: BinaryIO) -> Iterator[bytes]:
    while chunk := fh.read(CHUNK):
        yield chunk


def _open(path: Path) -> BinaryIO:
    """The file's bytes as UTF-8 text: gzip read transparently, UTF-16 (a BOM, as Windows
    tools write logs) transcoded on the fly; anything else as it is."""
    fh = (cast(BinaryIO, _Gunzip(path.open("rb"))) if path.suffix == ".gz"
          else path.open("rb"))  # (the caller closes it)
    head = fh.read(258)
    encoding = _utf16(head)
    fh.seek(0)
    if encoding is not None:
        fh.read(2)  # the BOM
        return cast(BinaryIO, _Transcoded(fh, encoding))
    return fh


def _utf16(head: bytes) -> str | None:
    """UTF-16 (LE or BE) by its BOM and the NUL halves of ASCII after it, or None: a BOM's
    two bytes alone are also what a garbled UTF-8 log may start with."""
    body = head[2:]
    if len(body) < 2:
        return None
    if head[:2] == codecs.BOM_UTF16_LE and body[1::2].count(0) * 2 >= len(body) // 2:
        return "utf-16-le"
    if head[:2] == codecs.BOM_UTF16_BE and body[0::2].count(0) * 2 >= len(body) // 2:
        return "utf-16-be"
    return None


class _Gunzip(io.RawIOBase):
    """A .gz file's text, member after member; one cut short or damaged gives everything
    decompressed before the break, then raises EOFError (gzip.open loses the last read)."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._broken: Exception | None = None
        self._left = b""  # decompressed past the last read's size

    def read(self, size: int = -1) -> bytes:
        out = bytearray(self._left)
        self._left = b""
        if self._broken is not None and not out:
            raise self._broken
        while self._broken is None and (size < 0 or len(out) < size):
            data = self._d.unused_data or self._raw.read(CHUNK)
            if self._d.eof:  # a member ended: the next one (if any) starts afresh
                if not data:
                    break
                self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            if not data:
                self._broken = EOFError("Compressed file ended before the end-of-stream "
                                        "marker was reached")
                break
            try:
                out += self._d.decompress(data)
            except zlib.error as e:
                self._broken = e
                break
        if not out and self._broken is not None:
            raise self._broken
        if 0 <= size < len(out):
            self._left = bytes(out[size:])
            del out[size:]
        return bytes(out)

    def seek(self, offset: int, whence: int = 0) -> int:
        if (offset, whence) != (0, 0):
            raise io.UnsupportedOperation("a .gz is read from its start only")
        self._raw.seek(0)
        self._d, self._broken = zlib.decompressobj(16 + zlib.MAX_WBITS), None
        self._left = b""
        return 0

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self._raw.close()
        super().close()


class _Transcoded(io.RawIOBase):
    """A UTF-16 file read as UTF-8 bytes (its BOM already read)."""

    def __init__(self, raw: BinaryIO, encoding: str) -> None:
        self._raw = raw
        self._decoder = codecs.getincrementaldecoder(encoding)("replace")

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size if size > 0 else -1)
        return self._decoder.decode(data, final=not data).encode("utf-8")

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self._raw.close()
        super().close()


def text_problem(path: Path) -> str | None:
    """Why a file does not look like a text log (most of its first 4 KiB control bytes or
    NULs: a binary file, another encoding), or None. It is read anyway."""
    try:
        with _open(path) as fh:
            head = fh.read(4096)
    except (OSError, EOFError, zlib.error):
        return None  # scan_file says why it cannot be read
    if not head:
        return None
    odd = sum(1 for b in head if b < 32 and b not in (9, 10, 13, 27, 12, 8))
    odd += head.decode("utf-8", "replace").count("\ufffd")  # not UTF-8 (a cut last one: ok)
    if odd * 20 <= len(head) + 20:  # (a Latin-1 log's accents are a few in a thousand)
        return None
    return (f"{_printable(str(path))}: does not look like a text log (about "
            f"{min(100, odd * 100 // len(head))}% of its first bytes are control bytes or not "
            "UTF-8): read anyway, so 'no failure found' may mean it could not be read; give "
            "the log as UTF-8 text")


def scan_file(path: Path, name: str | None = None, *, rank: int | None = None,
              tail_bytes: int | None = None, rules: RuleSet | None = None,
              trigger: Trigger | None = None, context_lines: int = 0) -> list[Finding]:
    """Findings of one log file (gzip read transparently). OSError propagates.

    `rank`: the file is that rank's alone (rank prefixes in it are ignored).
    `tail_bytes`: scan only the end of a big file (line numbers stay true: the newlines of
    the skipped part are counted, which is fast).
    `context_lines`: also keep that many of its last lines as context (diagnosis/context.py).
    """
    rules = rules or load_rules()
    if trigger is None or trigger.rules is not rules:
        trigger = trigger_for(rules)
    label = name or str(path)
    scan = FileScan(rules, label, trigger, rank if rank is not None else file_rank(label),
                    force_rank=rank is not None, context_lines=context_lines)
    with _open(path) as fh:
        if tail_bytes is not None and fh.seekable():  # a plain file (not .gz, not UTF-16)
            size = os.fstat(fh.fileno()).st_size
            if size > tail_bytes:
                skip = size - tail_bytes
                before = _count_lines(fh, skip)
                fh.seek(skip - 1)
                mid_line = fh.read(1) != b"\n"
                scan.start_mid_file(skip, before, mid_line)
        try:
            for chunk in _chunks(fh):
                scan.feed(chunk)
        except (EOFError, zlib.error) as e:  # a .gz cut short or damaged: keep what came
            raise CutShort(scan.finish(), str(e) or type(e).__name__) from None
    return scan.finish()


class CutShort(Exception):
    """A compressed log that ends early or is damaged part way: the findings before."""

    def __init__(self, findings: list[Finding], why: str) -> None:
        super().__init__(why)
        self.findings, self.why = findings, why


def _count_lines(fh: BinaryIO, upto: int) -> int:
    """Newlines in the first `upto` bytes; leaves the file at `upto`."""
    fh.seek(0)
    n, left = 0, upto
    while left > 0:
        chunk = fh.read(min(CHUNK, left))
        if not chunk:
            break
        n += chunk.count(b"\n")
        left -= len(chunk)
    return n


@dataclass
class Report:
    diagnosis: Diagnosis | None
    files: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # files that could not be read
    attempt: int | None = None
    job_dir: str | None = None
    attempt_failed: bool | None = None  # a job dir's: False when its record says it did not
    note: str | None = None  # how that attempt (or every attempt) ended, when not in failure


def _printable(name: str) -> str:
    """A file name as text: bytes that are not UTF-8 (surrogate-escaped) become U+FFFD."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def log_files(d: Path) -> list[Path]:
    """The files under `d` that may be logs (not the store, configs, checkpoints..., nor the
    stack dumps an attempt's `stacks/` holds: a hang's evidence and the looks before it)."""
    return sorted(p for p in d.rglob("*") if p.is_file() and not p.name.startswith(".")
                  and not p.name.endswith(SKIP_SUFFIXES) and not _stack_dump(p))


def _stack_dump(p: Path) -> bool:
    parts = p.parts
    return any(parts[i] == STACKS_DIR and _ATTEMPT_DIR.match(parts[i - 1])
               for i in range(1, len(parts) - 1))


@dataclass
class JobInputs:
    """What a job dir gives a diagnosis (read on the CLI side: cli/diagnose_job.py)."""

    attempt: int  # the attempt diagnosed
    files: list[tuple[Path, str]]  # its logs: (path, the name shown)
    exits: list[RankExit]  # its ranks' exits
    hung: Diagnosis | None  # the launcher's hang verdict, when no rank failed but it hung
    hang_files: list[str] = field(default_factory=list)  # the stack dumps that verdict read
    # a node loss ended it: each node lost, how, its ranks, why it is not blamed (if not)
    lost: list[tuple[str, str, list[int], str | None]] | None = None
    # the failure's time span: lines stamped at or before its start belong to an earlier
    # failure of the attempt (an in-process restart), after its end are its consequences
    window: tuple[datetime | None, datetime | None] = (None, None)
    failed: bool = True  # False: the attempt (files empty: every attempt) did not fail
    note: str | None = None  # how it ended, when it did not fail
    # lost with its launcher: rank -> (its log's last line's time, its node), the ranks
    # whose end nobody recorded (diagnosis.silent_peer)
    silent: dict[int, tuple[datetime, str | None]] = field(default_factory=dict)


# Reads `path` as a job dir (problems go to the list); None: `path` is not one.
JobReader = Callable[[Path, list[str]], JobInputs | None]


def diagnose_paths(paths: Sequence[Path], *, rules: RuleSet | None = None,
                   read_job: JobReader | None = None) -> Report:
    """Diagnose log files and directories of logs (walked). A path that `read_job` reads as
    a job dir gives that job's attempt logs, its ranks' exits and its hang verdict instead
    (`trainguard diagnose` passes cli.diagnose_job's reader; without one a job dir is
    walked as a directory of logs)."""
    rules = rules or load_rules()
    trigger = trigger_for(rules)
    report = Report(None)
    files: list[tuple[Path, str]] = []
    exits: list[RankExit] = []
    hung: Diagnosis | None = None
    hang_files: list[str] = []
    lost = None
    silent: dict[int, tuple[datetime, str | None]] = {}
    window: tuple[datetime | None, datetime | None] = (None, None)
    for p in paths:
        job = read_job(p, report.problems) if read_job is not None else None
        if job is not None:
            report.attempt, hung, lost, silent = job.attempt, job.hung, job.lost, job.silent
            hang_files = job.hang_files
            report.job_dir = str(p)
            report.attempt_failed, report.note, window = job.failed, job.note, job.window
            files += job.files
            exits += job.exits
        elif p.is_dir():
            found = log_files(p)
            if not found:
                report.problems.append(f"{p}: a directory with no log files in it")
            files += [(f, _printable(str(f))) for f in found]
        elif p.exists():
            files.append((p, _printable(str(p))))
        else:
            report.problems.append(f"{p}: no such file or directory")
    findings: list[Finding] = []
    for path, name in files:
        if (odd := text_problem(path)) is not None:
            report.problems.append(odd)
        try:
            findings += scan_file(path, name, rules=rules, trigger=trigger,
                                  context_lines=CONTEXT_LINES)
            report.files.append(name)
        except CutShort as e:
            findings += e.findings
            report.files.append(name)
            report.problems.append(f"{name}: cut short or damaged ({e.why}): what came before "
                                   f"was read. Fix: `gzip -t {name}` checks it; give the "
                                   "uncompressed log if you have it")
        except (OSError, EOFError, zlib.error) as e:  # EOFError, zlib: a damaged .gz
            what = getattr(e, "strerror", None) or str(e) or type(e).__name__
            report.problems.append(f"{name}: cannot read it ({what})")
    if not report.files and not exits and report.attempt_failed is not False:
        raise DiagnoseError("; ".join(report.problems) or "nothing to read: pass a job dir "
                            "(the one `trainguard run` printed) or log files")
    if window[0] is not None:
        start = window[0]
        findings = [f for f in findings if f.at is None or f.at_inherited or f.at > start]
    report.diagnosis = hung or diagnose(findings, exits, rules, window[1])
    # a log that shows an error (not only its last lines, kept as context) did not just stop
    errored = {f.rank for f in findings if not f.context and f.recovered is None}
    report.diagnosis = silent_peer(report.diagnosis, {
        r: v for r, v in silent.items() if r not in errored})
    report.files += hang_files  # what the verdict read too (walk-through 40 #9)
    if lost is not None:
        (node, why, ranks, not_blamed), *more = lost
        d = node_loss_diagnosis(node, why, ranks, report.diagnosis, not_blamed)
        report.diagnosis = replace(d, summary="; ".join([d.summary, *(  # the others too
            loss_summary(n, w, r) for n, w, r, _ in more)]))
    return report

