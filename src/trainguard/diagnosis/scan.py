"""Scan log bytes for findings, fast and tolerant of anything. Pure: bytes in, findings out.

Speed: one RE2 regex (every rule's pattern, tracebacks, exception lines) runs over big
chunks in C, at hundreds of MB/s; only the lines it hits are decoded and looked at in
Python. Robustness: bytes are decoded with replacement, a line longer than MAX_LINE is
cut (and the rest of it skipped), NUL and other binary bytes are just characters.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from trainguard.diagnosis.context import CONTEXT_BYTES, context_findings
from trainguard.diagnosis.exit_notices import exit_code
from trainguard.diagnosis.findings import Finding
from trainguard.diagnosis.lines import (
    CODE_LINE,
    COORDINATOR_REPORT,
    EXCEPTION_IN_LINE,
    EXCEPTION_LINE,
    IPYTHON_HEADER,
    OWN_EVENT,
    QUOTED_EXCEPTION,
    file_rank,
    is_library_path,
    line_time,
    recovery,
    split_prefix,
)
from trainguard.diagnosis.prefilter import Trigger, compile_trigger
from trainguard.diagnosis.rules import RuleSet

__all__ = ["FileScan", "compile_trigger", "scan_bytes"]

MAX_LINE = 1 << 20  # longer lines are cut here (and the rest skipped)
MAX_TEXT = 2000  # characters of a line kept in a finding
MAX_FINDINGS = 5000  # per file: the first half and the last half are kept
TRACEBACK_LINES = 400  # a traceback longer than this is cut
TRACEBACK_RESERVE = 256 << 10  # bytes kept for a traceback that starts near a chunk's end
MORE_LINES = 5  # lines of an exception's message after its first, kept with it

_TB_HEADER = "Traceback (most recent call last):"
_ORIGINAL = "Original"  # the word before a re-raised exception's own traceback (torch)
_CHAIN_MARKERS = ("During handling of the above exception", "The above exception was the direct")
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (.+)$')
_CKPT_FRAME = re.compile(r"distributed/(?:_shard/)?checkpoint/|load_checkpoint|load_state_dict"
                         r"|_load_from_state_dict|load_sharded|resume_from_checkpoint|load_state\b")
# a registry's builder (mmcv/mmengine `build_from_cfg`, fvcore/detectron2 `Registry.get`):
# raised there, the exception is about what the config names (a type not registered, no key)
_CFG_FRAME = re.compile(r"registry\b|\bbuild_from_cfg\b")


@dataclass
class _Stream:
    """Traceback bookkeeping of one (file, rank) stream."""

    chains: int = 0
    chained_next: bool = False


@dataclass
class FileScan:
    """Scans one file (or any byte stream) chunk by chunk: feed(), then finish()."""

    rules: RuleSet
    name: str
    trigger: Trigger  # the compiled prefilter and rule set
    default_rank: int | None = None
    force_rank: bool = False  # the file is one rank's (a launcher's log): ignore prefixes
    context_lines: int = 0  # keep this many of the file's last lines as context findings
    findings: list[Finding] = field(default_factory=list)
    dropped: int = 0
    lines: int = 0  # lines seen so far (complete ones)
    _offset: int = 0  # byte offset of the next chunk
    _carry: bytes = b""
    _skipping: bool = False  # inside a line longer than MAX_LINE (or cut by start_mid_file)
    _skip_counts: bool = False  # the newline that ends the skipped line is not counted yet
    _streams: dict[int | None, _Stream] = field(default_factory=dict)
    _consumed: set[int] = field(default_factory=set)  # offsets of parsed traceback lines
    _last_at: datetime | None = None
    _year: int | None = None
    _tail: bytes = b""  # the last CONTEXT_BYTES fed (context_lines > 0)
    _fed: int = 0  # bytes fed

    def start_mid_file(self, offset: int, lines_before: int, mid_line: bool = True) -> None:
        """The bytes fed next start at `offset`, after `lines_before` newlines; when that is
        inside a line (`mid_line`), the rest of that line is skipped."""
        self._offset, self.lines = offset, lines_before
        if mid_line:
            self._skipping = True
            self._skip_counts = True

    def feed(self, data: bytes) -> None:
        if self.context_lines:
            self._fed += len(data)
            self._tail = data[-CONTEXT_BYTES:] if len(data) >= CONTEXT_BYTES else (
                self._tail + data)[-CONTEXT_BYTES:]
        if self._skipping:
            nl = data.find(b"\n")
            if nl < 0:
                self._offset += len(data)
                return
            self._offset += nl + 1
            data = data[nl + 1:]
            if self._skip_counts:  # the partial first line of a tail is still a line
                self.lines += 1
            self._skipping = self._skip_counts = False
        buf = self._carry + data if self._carry else data
        start = self._offset - len(self._carry)
        end = buf.rfind(b"\n") + 1
        if end == 0 and len(buf) > MAX_LINE:  # one huge line: cut it, skip the rest
            # (its newline is counted here, so skipping to it counts nothing)
            self._process(buf[:MAX_LINE] + b"\n", start, final=True)
            self._carry, self._skipping = b"", True
            self._offset += len(data)
            return
        done = self._process(buf[:end], start, final=False, after=len(buf) - end) if end else 0
        self._carry = buf[done:]
        self._offset += len(data)

    def finish(self) -> list[Finding]:
        if self._carry:
            tail = self._carry if self._carry.endswith(b"\n") else self._carry + b"\n"
            self._process(tail, self._offset - len(self._carry), final=True)
            self._carry = b""
        found = self._mark_final()
        if self.context_lines and self._tail:
            whole = self._fed == len(self._tail) and self._offset == self._fed
            found += context_findings(
                self._tail, self.name, end=self._offset, last_line=self.lines, whole=whole,
                keep=self.context_lines, taken={f.offset for f in found},
                rank_of=self._rank_of)
        return found

    # -- internals ------------------------------------------------------------------------

    def _process(self, buf: bytes, base: int, *, final: bool, after: int = 0) -> int:
        """Scan complete lines in buf; returns how many bytes were consumed.

        Not `final` (more bytes will come): a traceback that runs past the end of buf is
        left unconsumed, to be parsed whole with the next chunk, unless it and the `after`
        bytes (the partial line that follows buf) already fill TRACEBACK_RESERVE. So the
        findings do not depend on how the bytes were split into chunks.
        """
        counted = 0  # bytes of buf whose newlines are already counted in self.lines
        skip_until = 0
        # one search per line hit, from the next line on (a line with a thousand hits costs
        # no more than a line with one)
        search = self.trigger.search
        while (m := search(buf, skip_until)) is not None:
            pos = m.start()
            ls = buf.rfind(b"\n", 0, pos) + 1
            le = buf.find(b"\n", pos)
            self.lines += buf.count(b"\n", counted, ls)
            counted = ls
            raw = buf[ls:le]
            skip_until = le + 1
            if base + ls in self._consumed:  # a line of a traceback parsed already
                self._consumed.discard(base + ls)
            elif _TB_HEADER.encode() in raw[:MAX_TEXT * 4]:  # (the part of a line read)
                wait = not final and len(buf) - ls + after < TRACEBACK_RESERVE
                parsed = self._traceback(buf, ls, le, base, wait)
                if parsed is None and wait:
                    self._consumed = {o for o in self._consumed if o >= base + ls}
                    return ls  # it runs past the end of buf: carry it over to the next chunk
                if not parsed:  # no exception line follows: the header's line is read as
                    # any other (a paste flattened onto one line ends in its error there)
                    self._line(raw, self.lines + 1, base + ls)
            else:
                self._line(raw, self.lines + 1, base + ls)
        self.lines += buf.count(b"\n", counted)
        self._consumed.clear()  # (lines without a hit are never looked up)
        return len(buf)

    def _decode(self, raw: bytes) -> str:
        return raw[:MAX_TEXT * 4].decode("utf-8", "replace").rstrip("\r")

    def _line(self, raw: bytes, line_no: int, offset: int,
              stream_rank: int | None = None) -> Finding | None:
        pre = split_prefix(self._decode(raw))
        text = pre.text
        if not text.strip() or CODE_LINE.match(text) or OWN_EVENT.match(text):
            return None
        rank = self._rank_of(pre.rank)
        if text.startswith(_CHAIN_MARKERS):  # the next exception of this stream is chained
            self._streams.setdefault(rank, _Stream()).chained_next = True
            return None
        at, inherited = self._time(pre.at, text)
        if (mark := recovery(text)) is not None:  # no failure: a rank recovered in place
            f = Finding(file=self.name, line=line_no, offset=offset, text=text[:MAX_TEXT],
                        rank=mark[0], node=pre.node, at=at, at_inherited=inherited,
                        recovered=mark[1])
            self._add(f)
            return f
        exc = EXCEPTION_LINE.match(text) or EXCEPTION_IN_LINE.search(text[:200])
        rule = self.trigger.match(text, is_exception=exc is not None or (
            "Traceback (" in text and IPYTHON_HEADER.match(text) is not None)
            or COORDINATOR_REPORT.search(text) is not None
            or QUOTED_EXCEPTION.search(text[:400]) is not None)
        code_rank, code = exit_code(text)
        if exc is None and rule is None and code is None:
            return None
        f = Finding(file=self.name, line=line_no, offset=offset, text=text[:MAX_TEXT],
                    rank=code_rank if code_rank is not None else rank, node=pre.node, at=at,
                    at_inherited=inherited, rule=rule.id if rule else None,
                    exc_type=exc.group(1) if exc else None, returncode=code,
                    chain=self._orphan_chain(rank) if exc else None)
        self._add(f)
        return f

    def _rank_of(self, prefixed: int | None) -> int | None:
        if self.force_rank or prefixed is None:
            return self.default_rank
        return prefixed

    def _orphan_chain(self, rank: int | None) -> int:
        s = self._streams.setdefault(rank, _Stream())
        if not s.chained_next:
            s.chains += 1
        s.chained_next = False
        return s.chains

    def _time(self, stamped: datetime | None, text: str) -> tuple[datetime | None, bool]:
        at = stamped
        if at is None:
            at, self._year = line_time(text, self._year)
        if at is not None:
            self._last_at = at
            return at, False
        return self._last_at, self._last_at is not None

    def _traceback(self, buf: bytes, ls: int, le: int, base: int, wait: bool) -> bool | None:
        """Parse the traceback whose header is the line at ls: True when it ends in an
        exception line (then its lines are in _consumed), False when it was cut (a new header
        of its stream, TRACEBACK_LINES lines: its lines are scanned as usual), None when buf
        ends first.

        Lines of the same stream (same rank prefix) belong to it, but for unindented ones that
        are no exception line (another thread's warning): those are scanned as usual, before
        the exception. Lines of other streams in between (their own tracebacks too) are left
        to be scanned as usual.
        """
        header = split_prefix(self._decode(buf[ls:le]))
        rank = self._rank_of(header.rank)
        # another prefix before the header (a logger's time, a job id) comes on every line
        # of the traceback too, with the same width: cut that many characters
        col = max(header.text.find(_TB_HEADER), 0)
        # torch's DataLoader re-raises a worker's exception in the main process with the
        # worker's own traceback below its message, headed `Original Traceback (...)`
        original = header.text[:col].strip() == _ORIGINAL
        col = 0 if original else col
        stream = self._streams.setdefault(rank, _Stream())
        frames: list[tuple[str, str, str]] = []
        mine: list[int] = []  # offsets of its lines
        between: list[tuple[bytes, int, int]] = []  # unindented lines of its stream
        pos, n, line_no = le + 1, 0, self.lines + 1
        while pos < len(buf) and n < TRACEBACK_LINES:
            end = buf.find(b"\n", pos)
            end = len(buf) if end < 0 else end
            line_no += 1
            n += 1
            pre = split_prefix(self._decode(buf[pos:end]))
            if self._rank_of(pre.rank) == rank:
                text = _cut(pre.text, col)
                fm = _FRAME.match(text)
                if fm:
                    frames.append((fm.group(1), fm.group(2), fm.group(3).strip()))
                elif text[:1] not in (" ", "\t", ""):
                    if text.startswith(_TB_HEADER):
                        return False  # the last one was cut before its exception line
                    exc = EXCEPTION_LINE.match(text)
                    if exc is not None:
                        more = self._more(buf, end, rank, col, wait)
                        if more is None:
                            return None  # its message may go on past the end of buf
                        for raw, no, at in between:
                            self._line(raw, no, at)
                            self._consumed.add(at)
                        self._consumed.update(mine)
                        self._consumed.add(base + pos)
                        if original:
                            self._from_worker(rank, frames, stream)
                        self._exception(text, exc, frames, line_no, base + pos, pre, stream,
                                        rank, more)
                        return True
                    if self.trigger.search(buf[pos:end]):
                        between.append((buf[pos:end], line_no, base + pos))
                    pos = end + 1
                    continue
                mine.append(base + pos)
            pos = end + 1
        return None if pos >= len(buf) and n < TRACEBACK_LINES else False

    def _more(self, buf: bytes, end: int, rank: int | None, col: int,
              wait: bool) -> tuple[str, ...] | None:
        """The indented lines of its stream right after an exception line at `end`: the rest
        of a message that spans lines (`Error(s) in loading state_dict for GPT:` and its
        `\tMissing key(s) ...`), up to MORE_LINES; None when buf ends before they do and
        more bytes can still come (`wait`)."""
        out: list[str] = []
        pos = end + 1
        while len(out) < MORE_LINES:
            nl = buf.find(b"\n", pos)
            if nl < 0:
                if wait:
                    return None
                nl = len(buf)
            if pos >= nl:
                break
            pre = split_prefix(self._decode(buf[pos:nl]))
            text = _cut(pre.text, col)
            if (self._rank_of(pre.rank) != rank or text[:1] not in (" ", "\t")
                    or not text.strip() or _FRAME.match(text)):
                break
            out.append(text.strip()[:MAX_TEXT])
            pos = nl + 1
        return tuple(out)

    def _from_worker(self, rank: int | None, frames: list[tuple[str, str, str]],
                     stream: _Stream) -> None:
        """An `Original Traceback` is the worker's side of the exception just re-raised (`X:
        Caught X in DataLoader worker process N.`): one chain with it, and where the worker
        raised is where that exception was raised (not the `for` loop that got it)."""
        for i in range(len(self.findings) - 1, -1, -1):
            f = self.findings[i]
            if f.rank == rank and f.traceback and f.exc_type is not None:
                if f.chain == stream.chains:
                    stream.chained_next = True
                    user = [x for x in frames if not is_library_path(x[0])]
                    if user:
                        self.findings[i] = f.model_copy(update={
                            "frame": f"{user[-1][0]}:{user[-1][1]} in {user[-1][2]}",
                            "library_frame": is_library_path(frames[-1][0])})
                return

    def _exception(self, text: str, exc: re.Match[str] | None,
                   frames: list[tuple[str, str, str]], line_no: int, offset: int,
                   pre: object, stream: _Stream, rank: int | None,
                   more: tuple[str, ...] = ()) -> None:
        if not stream.chained_next:
            stream.chains += 1
        stream.chained_next = False
        user = [f for f in frames if not is_library_path(f[0])]
        deepest = frames[-1] if frames else None
        frame = user[-1] if user else None
        at, inherited = self._time(getattr(pre, "at", None), text)
        rule = self.trigger.match(text, is_exception=True)
        # a launcher's exception can be an exit notice too (`CalledProcessError: ... died
        # with <Signals.SIGKILL: 9>`): the child's signal is what it says
        code = exit_code(text)[1]
        self._add(Finding(
            file=self.name, line=line_no, offset=offset, text=text[:MAX_TEXT], rank=rank,
            node=getattr(pre, "node", None), at=at, at_inherited=inherited,
            rule=rule.id if rule else None, returncode=code,
            exc_type=exc.group(1) if exc else text.split(":", 1)[0][:200], traceback=True,
            # the path as the traceback printed it: one the user can open
            frame=None if frame is None else f"{frame[0]}:{frame[1]} in {frame[2]}",
            library_frame=deepest is not None and is_library_path(deepest[0]),
            checkpoint_load=any(_CKPT_FRAME.search(f"{f[0]} {f[2]}") for f in frames),
            config_build=deepest is not None and _CFG_FRAME.search(
                f"{deepest[0]} {deepest[2]}") is not None,
            chain=stream.chains, more=more))

    def _add(self, f: Finding) -> None:
        self.findings.append(f)
        if len(self.findings) > MAX_FINDINGS:  # keep the first and the latest
            del self.findings[MAX_FINDINGS // 2]
            self.dropped += 1

    def _mark_final(self) -> list[Finding]:
        """Flag the exceptions of each stream's last chain: what that process died of."""
        last: dict[int | None, int] = {}
        for f in self.findings:
            if f.exc_type is not None and f.chain is not None:
                last[f.rank] = max(last.get(f.rank, 0), f.chain)
        return [f.model_copy(update={"final": True})
                if f.exc_type is not None and f.chain is not None and f.chain == last[f.rank]
                else f for f in self.findings]


def _cut(text: str, col: int) -> str:
    """A traceback line without the `col` characters of prefix its header had, unless that
    cut would split a word (the line has no such prefix: garbage before the header)."""
    if col and len(text) > col and not (text[col - 1].isalnum() or text[col - 1] == "_"):
        return text[col:]
    return text


def scan_bytes(rules: RuleSet, trigger: Trigger, name: str, chunks: Iterable[bytes],
               default_rank: int | None = None, force_rank: bool = False,
               context_lines: int = 0) -> list[Finding]:
    scan = FileScan(rules, name, trigger, default_rank if default_rank is not None
                    else file_rank(name), force_rank, context_lines)
    for chunk in chunks:
        scan.feed(chunk)
    return scan.finish()
