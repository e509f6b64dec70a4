"""A log's last lines, kept as context for the fallback. Pure.

The rules see only the lines the prefilter hits. When none of them decides (a process
killed with nothing but `Killed` on a progress line, an error phrased in words no rule
knows), the cause is almost always among the last lines the process wrote: the scanner keeps
the last CONTEXT_BYTES of each file and hands the last few lines no rule or exception took
over as `context` findings, which only diagnosis/fallback.py reads. Cost: one slice per
chunk and a few dozen lines decoded per file, whatever its size.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from trainguard.diagnosis.findings import Finding
from trainguard.diagnosis.lines import CODE_LINE, OWN_EVENT, split_prefix

CONTEXT_BYTES = 16 << 10  # the end of a file kept for its context lines
CONTEXT_LINES = 24  # lines kept per file
CONTEXT_TEXT = 400  # characters of a context line kept
_FRAME_END = re.compile(rb'", line \d+, in \S+\s*$')  # a frame line (its start may be cut)
_SKIP = ("Traceback (most recent call last)", "File \"", "frame #")  # and C++ stack frames
# ... but a traceback flattened onto one line (a paste: `Traceback (most recent call last): File
# "x.py", line 5, in f ... AssertionError: ...`) holds its exception: kept
_FLATTENED = re.compile(r'^Traceback \(most recent call last\):? +File "')
# (and a header that is the file's last line, nothing after it: an exception was raised, the
# log cut before it said which; kept, so that the answer is `other` on it, not none)
# a frame of importlib's loader in faulthandler's stack (`line N in f`, no comma): a native
# crash came while a module loaded (diagnosis/restart.py); one such line is kept
_LOADER_FRAME = re.compile(r'^File "<frozen importlib\._bootstrap(?:_external)?>", line \d+ in ')
# plumbing: a `with` statement's (contextlib's __enter__/__exit__) or a wait's (threading's,
# queue's): the frame that entered it, one further out, says where the traceback stopped
# (a `with` that waits for the other ranks, a DataLoader waiting for its workers' batches),
# so it is kept too
_WITH_FRAME = re.compile(r'[/\\](?:contextlib|threading|queue)\.py", line \d+, in ')
# an exception line quoted inside a long line of prose (an issue's `... I got an error
# `ImportError: cannot import name ...``): past the characters kept, the kept text starts there
_QUOTED_EXCEPTION = re.compile(r"\b(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception): \S")
# a reading that went NaN or infinite in a right-aligned table of statistics (rsl_rl's
# `               Value function loss: inf`): indented, but no source line; kept
_NONFINITE_READING = re.compile(r"^[A-Za-z][\w /.()-]*:\s*[-+]?(?:nan|inf)\s*$", re.IGNORECASE)


def context_findings(tail: bytes, name: str, *, end: int, last_line: int, whole: bool,
                     keep: int, taken: set[int],
                     rank_of: Callable[[int | None], int | None]) -> list[Finding]:
    """The last `keep` meaningful lines of `tail` (the bytes that end at offset `end`, the
    file's line `last_line` being its last) that are not findings already (`taken`:
    offsets). `whole`: tail is the whole file (else its first, partial line is dropped)."""
    pieces = tail.split(b"\n")
    if tail.endswith(b"\n"):
        pieces.pop()
    pos = end - (1 if tail.endswith(b"\n") else 0)  # where the last piece ends
    out: list[Finding] = []
    line = last_line
    cut = True  # still at the file's end: a traceback that ends here was cut before its
    # exception line, and its innermost frame and source line say where it stopped
    loader = False  # a loader frame of faulthandler's stack kept
    for i in range(len(pieces) - 1, -1, -1):
        raw = pieces[i]
        start = pos - len(raw)
        pos = start - 1
        if (i == 0 and not whole) or line < 1:
            break
        no = line
        line -= 1
        if start in taken or not raw.strip():
            continue
        pre = split_prefix(raw[:CONTEXT_TEXT * 4].decode("utf-8", "replace").rstrip("\r"))
        text = pre.text.strip()
        if cut and (text.startswith('File "') or (pre.text.startswith("    ") and i > 0
                                                   and _FRAME_END.search(pieces[i - 1]))
                    or (no == last_line and text.startswith("assert "))):
            # its source line, then the frame's (and the next frame's, out of a `with`)
            cut = not text.startswith('File "') or _WITH_FRAME.search(text) is not None
        elif not loader and _LOADER_FRAME.match(text):
            loader = True
        elif not text or CODE_LINE.match(pre.text) or OWN_EVENT.match(text) \
                or (pre.text.startswith("    ") and not _NONFINITE_READING.match(text)) \
                or (text.startswith(_SKIP) and not _FLATTENED.match(text)
                    and not (no == last_line and text.startswith(_SKIP[0]))) \
                or not any(c.isalpha() for c in text):
            continue
        else:
            cut = False
        out.append(Finding(file=name, line=no, offset=start, text=_kept(text),
                           rank=rank_of(pre.rank), node=pre.node, context=True))
        if len(out) >= keep:
            break
    out.reverse()
    return out


def _kept(text: str) -> str:
    """A context line's first CONTEXT_TEXT characters, or, when it is longer and an exception
    line is quoted past them (and none before) in prose, the CONTEXT_TEXT from that exception
    on (not in a traceback flattened onto one line: its frames say where it stopped)."""
    if len(text) > CONTEXT_TEXT and not _FLATTENED.match(text):
        m = _QUOTED_EXCEPTION.search(text)
        if m is not None and m.end() > CONTEXT_TEXT:
            return text[m.start():m.start() + CONTEXT_TEXT]
    return text[:CONTEXT_TEXT]
