"""Hang incidents with every rank's stack: the HangConfirmed events, and what the controller
wrote next to the logs (`attempt-N/stacks/rank-R.txt`, `hang.json`; trainguard.paths)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from trainguard.controller.store import JobStore
from trainguard.controller.store_rows import log_dir_of
from trainguard.paths import HANG_FILE, stacks_dir
from trainguard.records import Reason
from trainguard.ui.eventlog import EventLog
from trainguard.ui.jobs import RECENT_INCIDENTS, hang_item

MAX_STACK_BYTES = 256 * 1024  # of one rank's stack text shown
_RANK_FILE = re.compile(r"rank-(\d+)\.txt$")


def hangs(job_dir: Path) -> list[dict[str, Any]]:
    """Every confirmed hang (the newest RECENT_INCIDENTS), oldest first, each with its ranks'
    stacks: the dumped text when the file is there, else the event's innermost frames."""
    with JobStore.open(job_dir) as store, EventLog(job_dir) as log:
        logs = log_dir_of(store.meta(), job_dir)
        items = [hang_item(i, e) for i, e in
                 log.newest(RECENT_INCIDENTS, [Reason.HANG_CONFIRMED.value])]
    return [with_stacks(h, logs) for h in items]


def with_stacks(item: dict[str, Any], logs: Path) -> dict[str, Any]:
    attempt = item.get("attempt")
    out = stacks_dir(logs, attempt) if isinstance(attempt, int) else None
    verdict = _read_json(out / HANG_FILE) if out is not None else {}
    culprit = item.get("culprit") or verdict.get("culprit") or {}
    by_rank: dict[str, Any] = culprit.get("by_rank") or {}
    texts = _stack_texts(out) if out is not None else {}
    ranks = sorted({*map(int, texts), *(int(r) for r in item.get("stacks", {})),
                    *(int(r) for r in by_rank)})
    item = dict(item)
    item["cleared_at"] = verdict.get("cleared_at")
    item["stacks_dir"] = str(out) if out is not None else None
    item["ranks"] = [{
        "rank": r, "doing": by_rank.get(str(r)), "culprit": culprit.get("rank") == r,
        "text": texts.get(r), "frames": item.get("stacks", {}).get(str(r), []),
        "error": item.get("stack_errors", {}).get(str(r)),
    } for r in ranks]
    return item


def _stack_texts(out: Path) -> dict[int, str]:
    texts: dict[int, str] = {}
    try:
        files = sorted(out.glob("rank-*.txt"))
    except OSError:
        return texts
    for f in files:
        m = _RANK_FILE.search(f.name)
        if m is None:
            continue
        try:
            with open(f, "rb") as fh:
                raw = fh.read(MAX_STACK_BYTES + 1)
        except OSError:
            continue
        text = raw[:MAX_STACK_BYTES].decode("utf-8", errors="replace")
        texts[int(m.group(1))] = text + ("\n... (cut)" if len(raw) > MAX_STACK_BYTES else "")
    return texts


def _read_json(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_STACK_BYTES)
        doc = json.loads(raw)
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}
