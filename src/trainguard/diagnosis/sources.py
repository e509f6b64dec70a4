"""Where findings come from: log files, job dirs (their attempt logs and worker exits). I/O.

`diagnose_paths` is what `trainguard diagnose` runs; `scan_file` is what a node agent runs
on its ranks' logs after a failure. Both end in verdict.diagnose.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import BinaryIO, cast

from trainguard.diagnosis.findings import Finding
from trainguard.diagnosis.hung import hang_diagnosis
from trainguard.diagnosis.lines import file_rank
from trainguard.diagnosis.prefilter import Trigger, compile_trigger
from trainguard.diagnosis.rules import RuleSet, load_rules
from trainguard.diagnosis.scan import FileScan, scan_bytes
from trainguard.diagnosis.taxonomy import Diagnosis
from trainguard.diagnosis.verdict import RankExit, diagnose
from trainguard.errors import DiagnoseError

CHUNK = 8 << 20
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
    if path.suffix == ".gz":
        return cast(BinaryIO, gzip.open(path, "rb"))
    return path.open("rb")


def scan_file(path: Path, name: str | None = None, *, rank: int | None = None,
              tail_bytes: int | None = None, rules: RuleSet | None = None,
              trigger: Trigger | None = None) -> list[Finding]:
    """Findings of one log file (gzip read transparently). OSError propagates.

    `rank`: the file is that rank's alone (rank prefixes in it are ignored).
    `tail_bytes`: scan only the end of a big file (line numbers stay true: the newlines of
    the skipped part are counted, which is fast).
    """
    rules = rules or load_rules()
    if trigger is None or trigger.rules is not rules:
        trigger = trigger_for(rules)
    label = name or str(path)
    scan = FileScan(rules, label, trigger, rank if rank is not None else file_rank(label),
                    force_rank=rank is not None)
    with _open(path) as fh:
        if tail_bytes is not None and path.suffix != ".gz":
            size = os.fstat(fh.fileno()).st_size
            if size > tail_bytes:
                skip = size - tail_bytes
                before = _count_lines(fh, skip)
                fh.seek(skip - 1)
                mid_line = fh.read(1) != b"\n"
                scan.start_mid_file(skip, before, mid_line)
        for chunk in _chunks(fh):
            scan.feed(chunk)
    return scan.finish()


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


def _printable(name: str) -> str:
    """A file name as text: bytes that are not UTF-8 (surrogate-escaped) become U+FFFD."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _log_files(d: Path) -> list[Path]:
    return sorted(p for p in d.rglob("*") if p.is_file() and not p.name.startswith(".")
                  and not p.name.endswith(SKIP_SUFFIXES))


def _job_inputs(job_dir: Path, attempt: int | None, problems: list[str]
                ) -> tuple[int, list[tuple[Path, str]], list[RankExit], Diagnosis | None]:
    """The attempt to diagnose, its log files, its ranks' exits and, when no rank failed
    but the launcher confirmed a hang, that hang's diagnosis."""
    from trainguard.controller.store import JobStore
    from trainguard.node.logs import attempt_log_dir

    with JobStore.open(job_dir) as store:
        meta = store.meta()
        rows = store.all_workers()
    attempts = sorted({r.attempt for r in rows})
    log_dir = Path(str(meta.get("log_dir") or job_dir / "logs"))
    failed = sorted({r.attempt for r in rows if r.state == "failed"}
                    | {a for a in attempts if _hang_file(log_dir, a).is_file()})
    if attempt is None:
        attempt = failed[-1] if failed else (attempts[-1] if attempts else 0)
    adir = attempt_log_dir(log_dir, attempt)
    files = [(p, str(p.relative_to(job_dir)) if p.is_relative_to(job_dir) else str(p))
             for p in (_log_files(adir) if adir.is_dir() else [])
             if "stacks" not in p.relative_to(adir).parts]  # stack dumps are not logs
    if not files:
        problems.append(f"{adir}: no logs of attempt {attempt} (known attempts: "
                        f"{', '.join(map(str, attempts)) or 'none'})")
    exits = [RankExit(r.rank, r.state == "failed", r.exit_code, r.ended_at,
                      r.oom_killed, r.node)
             for r in rows if r.attempt == attempt]
    hung = None if any(e.failed for e in exits) else _hang_report(job_dir, log_dir, attempt)
    return attempt, files, exits, hung


def _hang_file(log_dir: Path, attempt: int) -> Path:
    return log_dir / f"attempt-{attempt}" / "stacks" / "hang.json"


def _hang_report(job_dir: Path, log_dir: Path, attempt: int) -> Diagnosis | None:
    """The launcher's hang verdict of `attempt`, with its stack dumps, if it hung."""
    path = _hang_file(log_dir, attempt)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("cleared_at"):
        return None  # the job made progress again after that hang
    texts = {}
    for f in sorted(path.parent.glob("rank-*.txt")):
        rank = file_rank(f.name)
        if rank is not None:
            name = str(f.relative_to(job_dir)) if f.is_relative_to(job_dir) else str(f)
            texts[rank] = (name, f.read_text(encoding="utf-8", errors="replace"))
    return hang_diagnosis(data, texts)


def diagnose_paths(paths: Sequence[Path], attempt: int | None = None,
                   rules: RuleSet | None = None) -> Report:
    """Diagnose job dirs and/or log files (directories of logs are walked)."""
    rules = rules or load_rules()
    trigger = trigger_for(rules)
    report = Report(None)
    files: list[tuple[Path, str]] = []
    exits: list[RankExit] = []
    hung: Diagnosis | None = None
    for p in paths:
        if (p / "trainguard.db").is_file():
            report.attempt, more, ex, hung = _job_inputs(p, attempt, report.problems)
            report.job_dir = str(p)
            files += more
            exits += ex
        elif p.is_dir():
            found = _log_files(p)
            if not found:
                report.problems.append(f"{p}: a directory with no log files in it")
            files += [(f, _printable(str(f))) for f in found]
        elif p.exists():
            files.append((p, _printable(str(p))))
        else:
            report.problems.append(f"{p}: no such file or directory")
    findings: list[Finding] = []
    for path, name in files:
        try:
            findings += scan_file(path, name, rules=rules, trigger=trigger)
            report.files.append(name)
        except (OSError, EOFError, zlib.error) as e:  # EOFError, zlib: a damaged .gz
            what = getattr(e, "strerror", None) or str(e) or type(e).__name__
            report.problems.append(f"{name}: cannot read it ({what})")
    if not report.files and not exits:
        raise DiagnoseError("; ".join(report.problems) or "nothing to read: pass a job dir "
                            "(the one `trainguard run` printed) or log files")
    report.diagnosis = hung or diagnose(findings, exits, rules)
    return report

