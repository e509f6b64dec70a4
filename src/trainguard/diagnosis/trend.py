"""A job's host memory growing until its log stops: the OOM killer's work, when nothing was
printed about it. Pure.

Training scripts often log their resident memory (`RSS MEM USE: 5.11G`, `host mem 12 GB`).
When such readings climb steeply (the last ones at least GROWTH times the first, above
MIN_PEAK_GIB) and the log then ends with no error, the process was most likely killed by
the kernel for memory; diagnosis/fallback.py asks this only when nothing else answered.
So is a last reading that gives the host memory as nearly all used (DeepSpeed's `CPU Virtual
Memory:  used = 29.71 GB, percent = 95.3%`): the next allocation is the kernel's to refuse.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

GROWTH = 4.0  # the peak is at least this many times the first reading
MIN_PEAK_GIB = 16.0  # and at least this big
MIN_READINGS = 3
_LAST = 3  # the peak is among the last readings: the log stopped while memory was high
_READING = re.compile(
    r"\b(?:rss|ram|resident|host mem\w*|cpu mem\w*|system memory|mem(?:ory)?[ _]us(?:e|age))"
    r"\b[^0-9\n]{0,24}?(\d+(?:\.\d+)?)\s*([kmgt])i?b?\b", re.IGNORECASE)
FULL_PERCENT = 90.0  # a host memory reading at least this full, the last one before the end
_PERCENT = re.compile(
    r"\b(?:rss|ram|resident|host mem\w*|cpu mem\w*|cpu virtual memory|virtual memory|system "
    r"memory|mem(?:ory)?[ _]us(?:e|age))\b[^%\n]{0,48}?(?:percent\s*[=:]\s*)?(\d{1,3}(?:\.\d+)?)"
    r"\s*%", re.IGNORECASE)
_DEVICE = re.compile(r"\b(?:gpu|cuda|device|vram|hbm|npu|xla|tpu)\b", re.IGNORECASE)
_GIB = {"k": 1 / (1 << 20), "m": 1 / 1024, "g": 1.0, "t": 1024.0}


def memory_growth(lines: Sequence[str]) -> tuple[int, float, float] | None:
    """(index of the peak reading's line, first GiB, peak GiB) when the host memory the
    lines report grows steeply to the end, else None."""
    readings: list[tuple[int, float]] = []
    for i, text in enumerate(lines):
        m = _READING.search(text)
        if m is None or _DEVICE.search(text):
            continue
        readings.append((i, float(m.group(1)) * _GIB[m.group(2).lower()]))
    if len(readings) < MIN_READINGS:
        return None
    first = readings[0][1]
    at, peak = max(readings[-_LAST:], key=lambda r: r[1])
    if peak < MIN_PEAK_GIB or peak < GROWTH * max(first, 1e-9):
        return None
    return at, first, peak


def memory_full(lines: Sequence[str]) -> tuple[int, float] | None:
    """(index of the line, percent) when the last reading of the host memory's use as a
    percentage is FULL_PERCENT or more, else None."""
    last: tuple[int, float] | None = None
    for i, text in enumerate(lines):
        m = _PERCENT.search(text)
        if m is not None and not _DEVICE.search(text):
            last = (i, float(m.group(1)))
    return last if last is not None and last[1] >= FULL_PERCENT else None
