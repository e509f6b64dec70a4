"""Reading one log line: launcher and rank prefixes, timestamps, exception lines. Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone

from trainguard.diagnosis.findings import REENTERED, REEXECUTED, STARTED
from trainguard.worker.contract import RECOVERY_PATTERN, STAMP_PATTERN

# trainguard's own stamp (worker.contract): `<ISO time read> <out|err> `, group 1 the time
_STAMP = re.compile("^" + STAMP_PATTERN)
# line numbers some issue trackers add in front of pasted lines: "[1830] [rank3]:..."
_PASTE_NUMBER = re.compile(r"^\[\d+\]\s+(?=\[(?:rank|default)\d+\])")
# what a paste in an issue thread wraps a line in: quote markers ("> "), markdown emphasis or
# code ticks, curly quotes (at the start and the end of the line)
_MARKS = ">*`\u201c\u201d"
_LEAD = re.compile(r"(?:>\s?){1,4}(?=\S)|(?:\*\*|`{1,3}|[\u201c\u201d])(?=\S)")
_TRAIL = re.compile(r"(?<=\S)(?:\*\*|`{1,3}|[\u201c\u201d])[ \t]{0,8}$")
# pdsh/DeepSpeed/mpirun host prefix in front of a rank prefix: "worker-1: [rank9]: ..."
# Ray's actor prefix: "(RayTrainWorker pid=9672, ip=10.0.0.3) ..."
_RAY = re.compile(r"^\((?:[\w.]+ )?pid=\d+(?:, ip=([\d.]+))?\)\s")
_HOST = re.compile(
    r"^([A-Za-z0-9][\w.-]*): (?=\[(?:rank|default)\d+\]|\[rank \d{1,7}\] |\s{0,4}\d{1,5}: "
    r"|\[\d+,\d+\]<)")
# (ranks have at most 7 digits: int() of a 5000-digit run would raise, not parse);
# `[rank 3] ` is trainguard's own console copy of a rank's lines (node/logs.py; review 36 #2:
# `trainguard run ... > job.out`, what a Slurm job keeps, was read without its ranks)
_RANK = re.compile(
    r"^(?:\[rank(?P<a>\d{1,7})\]:\s?|\[default(?P<b>\d{1,7})\]:\s?"
    r"|\[\d+,(?P<c>\d{1,7})\]<std\w+>:\s?|\s{0,4}(?P<d>\d{1,5}): "
    r"|\[rank (?P<e>\d{1,7})\] )")
_ISO = re.compile(r"(\d{4})-(\d\d)-(\d\d)[ T](\d\d):(\d\d):(\d\d)(?:[.,](\d{1,9}))?")
_GLOG = re.compile(r"^\[?[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{1,9})")
_SYSLOG = re.compile(r"^([A-Z][a-z]{2})\s+(\d{1,2}) (\d\d):(\d\d):(\d\d)\b")
_MONTHS = {m: i for i, m in enumerate(
    ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1)}
_FILE_RANK = re.compile(r"rank[-_]?(\d{1,7})(?!\d)", re.IGNORECASE)
_LIBRARY = ("site-packages", "dist-packages", "/lib/python", "<frozen", "/usr/lib/", "<string>")
# trainguard's fault injection (trainguard.testing.faults) raises, sleeps or spins where the
# script called it: that call, not the injector's own frames, is the culprit's frame, even
# where trainguard is installed from a source tree (not under site-packages).
FAULT_INJECTION_PATH = "/trainguard/testing/"
# trainguard's own code in a job (its trainer integrations, checkpoints, worker library) is a
# library to the script, installed from a source tree too (`pip install -e`: src/trainguard/)
_OWN = re.compile(r"/trainguard/(?:integrations|checkpoint|worker|testing)/")

# The last line of a Python traceback: `Type: message` (module path allowed) or `Type`.
EXCEPTION_LINE = re.compile(
    r"^((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Failure|Fault))"
    r"(?::\s?(.*))?\s*$")


# The same after some other prefix (a logger's time and source): "... ] KeyError: 'x'".
EXCEPTION_IN_LINE = re.compile(
    r"(?:^|[\s|\]>*])((?:[a-z_]\w*\.)*[A-Z]\w*(?:Error|Exception))(?::\s|\s*$)")
# An exception line quoted inside prose (an issue's `I encounter an error: "OSError: image
# file is truncated (3440 bytes not processed)."`): the rules for exception lines read it, but
# it is no exception of its own (a quoted exception no rule knows is not a user_code_error).
QUOTED_EXCEPTION = re.compile(r"[\"']((?:[a-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)): \S")
# IPython's (Jupyter's, Colab's) traceback header names the exception type first, with no
# colon (`UnidentifiedImageError                    Traceback (most recent call last)`):
# when a paste is cut before the exception line at the end, it is the only line that names
# the exception, so the rules for exception lines read it too.
IPYTHON_HEADER = re.compile(
    r"^\s*(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Failure|Fault)"
    r"\s{2,}Traceback \(most recent call last\)")
# TensorFlow's Coordinator reporting the exception a thread of the input pipeline or the
# training loop raised (`INFO:tensorflow:Error reported to Coordinator: <class
# '...InvalidArgumentError'>, Invalid JPEG data, size 82243`): the exception the run stops
# with, at INFO level, so the rules for exception lines read it too.
COORDINATOR_REPORT = re.compile(r"\bError reported to Coordinator: ")
# trainguard's line where a rank recovered in place: group 1 the rank, group 2 the kind
_RECOVERY_LINE = re.compile("^" + RECOVERY_PATTERN)
# its kind's first word -> Finding.recovered
_RECOVERY_KINDS = {"step": REEXECUTED, "restarting": REENTERED, "started": STARTED}
# trainguard's own lines in its console copy that are no facts of the ranks: its verdicts
# (FailureDiagnosed: review 39 #7, `diagnose job.out` took its "not by the kernel's OOM
# killer" for an OOM; JobFailed, which repeats it: walk-through 37 #4, listed as a symptom
# of the rank it names), its Info events and its own logging (`[trainguard] WARNING
# trainguard.controller.fleet: ...`, review 40 #10; LinksDown, its own state in a full
# disruption, once that log line). Its Warning and Error events of facts are
# read: WorkerFailed, HangConfirmed, NodeLost are the console's only record of those failures
# (review 40 #2: skipping them all said "no failure found" for a hang or a lost node)
OWN_EVENT = re.compile(r"^\[trainguard\] (?:\d\d:\d\d:\d\d (?:Info [A-Z][A-Za-z]+|Warning "
                       r"(?:FailureDiagnosed|LinksDown)|Error JobFailed): "
                       r"|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) trainguard\b)")
# Source lines inside a traceback: never findings themselves.
CODE_LINE = re.compile(r"^\s+(?:raise\b|assert\b|File \"|\^+\s*$|~+)")


@dataclass(frozen=True)
class Prefixed:
    text: str
    rank: int | None = None
    node: str | None = None
    at: datetime | None = None


def split_prefix(line: str) -> Prefixed:
    """Strip trainguard's stamp, a host prefix and a rank prefix (`[rank3]:`, `[default3]:`,
    srun -l's `3: `, mpirun's `[1,3]<stderr>:`, trainguard's console `[rank 3] `); keep what
    they say."""
    at = None
    m = _STAMP.match(line)
    if m:
        try:
            at = _aware(datetime.fromisoformat(m.group(1)))
        except ValueError:
            at = None
        line = line[m.end():]
    line = _PASTE_NUMBER.sub("", line, count=1)
    line = _unwrap(line)
    node = None
    ray = _RAY.match(line)
    if ray:
        node, line = ray.group(1), line[ray.end():]
    h = _HOST.match(line)
    if h:
        node, line = h.group(1), line[h.end():]
    rank = None
    r = _RANK.match(line)
    if r:
        rank = int(next(g for g in r.groups() if g is not None))
        line = line[r.end():]
        r2 = _RANK.match(line)  # "[rank0]:[rank0]: ...", "[rank 0] [rank0]: ...": nested
        if r2 and r2.group("d") is None:
            line = line[r2.end():]
    return Prefixed(line, rank, node, at)


def _unwrap(line: str) -> str:
    """The line without the markup a paste put around it (only its ends are looked at)."""
    if line[:1] in _MARKS and (lead := _LEAD.match(line)) is not None:
        line = line[lead.end():]
    end = line.rstrip(" \t")[-1:]
    if end and end in _MARKS and (trail := _TRAIL.search(line, max(len(line) - 16, 0))):
        line = line[:trail.start()]
    return line


def _aware(dt: datetime) -> datetime:
    return dt if dt.tzinfo is not None else dt.replace(tzinfo=timezone.utc)


def line_time(text: str, year: int | None) -> tuple[datetime | None, int | None]:
    """The time a line states about itself, and the year to assume for year-less stamps.

    ISO times anywhere in the first 48 characters; glog (`E0321 02:07:08.408`, as torch's
    C++ logs) and syslog (`Mar 21 02:07:08`) stamps at the start take the year of the
    last ISO time seen in the same file, and are no time at all before one (lines of one
    file are then ordered by their position).
    """
    head = text[:48]
    m = _ISO.search(head)
    try:
        if m:
            y, mo, d, hh, mi, ss, frac = m.groups()
            us = int((frac or "0")[:6].ljust(6, "0"))
            dt = datetime(int(y), int(mo), int(d), int(hh), int(mi), int(ss), us, timezone.utc)
            return dt, int(y)
        if year is None:  # a month and day without a year orders nothing across files
            return None, year
        g = _GLOG.match(text)
        if g:
            mo, d, hh, mi, ss, frac = g.groups()
            us = int(frac[:6].ljust(6, "0"))
            return datetime(year, int(mo), int(d), int(hh), int(mi), int(ss), us,
                            timezone.utc), year
        s = _SYSLOG.match(text)
        if s and s.group(1) in _MONTHS:
            mon, d, hh, mi, ss = s.groups()
            return datetime(year, _MONTHS[mon], int(d), int(hh), int(mi), int(ss),
                            tzinfo=timezone.utc), year
    except ValueError:  # 31 February and friends: not a time
        return None, year
    return None, year


def file_rank(name: str) -> int | None:
    """The rank a file name states (`rank-3.log`, `rank3.txt`, `worker_rank_3.out`)."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    m = _FILE_RANK.search(base)
    return int(m.group(1)) if m else None


def is_library_path(path: str) -> bool:
    return any(p in path for p in _LIBRARY) or is_fault_injection(path) or is_trainguards(path)


def is_trainguards(path: str) -> bool:
    """A frame of trainguard's own code in a job (its trainer integrations, checkpoints,
    worker library, fault injection), wherever it is installed: a library to the script."""
    return _OWN.search(path.replace("\\", "/")) is not None


def is_fault_injection(path: str) -> bool:
    """A frame of trainguard's fault injection (never the user's own code)."""
    return FAULT_INJECTION_PATH in path.replace("\\", "/")


def recovery(text: str) -> tuple[int, str] | None:
    """trainguard's line where a rank recovered in place (worker.contract.RECOVERY_PATTERN):
    the rank it names and its kind (findings.REEXECUTED, REENTERED, STARTED); else None."""
    m = _RECOVERY_LINE.match(text)
    return None if m is None else (int(m.group(1)), _RECOVERY_KINDS[m.group(2).split()[0]])
