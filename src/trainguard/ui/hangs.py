"""Hang incidents with every rank's stack: the HangConfirmed events, and what the controller
wrote next to the logs (`attempt-N/stacks/rank-R.txt`, `hang.json`; trainguard.paths)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from trainguard.controller.store import JobStore
from trainguard.paths import HANG_FILE, STACKS_DIR
from trainguard.records import Reason
from trainguard.ui import jobfiles
from trainguard.ui.eventlog import EventLog
from trainguard.ui.jobs import RECENT_INCIDENTS, hang_item

MAX_STACK_BYTES = 256 * 1024  # of one rank's stack text shown
_RANK_FILE = re.compile(r"rank-(\d+)\.txt$")


def hangs(job_dir: Path) -> list[dict[str, Any]]:
    """Every confirmed hang (the newest RECENT_INCIDENTS), oldest first, each with its ranks'
    stacks: the dumped text when the file is there, else the event's innermost frames. Files
    the dashboard does not serve (ui/jobfiles.py) are left out, each named in `refused`."""
    with JobStore.open(job_dir) as store, EventLog(job_dir) as log:
        meta = store.meta()
        items = [hang_item(i, e) for i, e in
                 log.newest(RECENT_INCIDENTS, [Reason.HANG_CONFIRMED.value])]
    try:
        root: jobfiles.LogRoot | str = jobfiles.log_root(job_dir, meta)
    except jobfiles.Refused as e:
        root = str(e)
    return [with_stacks(h, root) for h in items]


def with_stacks(item: dict[str, Any], root: jobfiles.LogRoot | str) -> dict[str, Any]:
    """The hang's item with its ranks' stacks; `root` is the log dir, or why it is refused."""
    attempt = item.get("attempt")
    refused: list[str] = [root] if isinstance(root, str) else []
    names = [f"attempt-{attempt}", STACKS_DIR] if isinstance(attempt, int) else None
    verdict: dict[str, Any] = {}
    texts: dict[int, str] = {}
    if names is not None and isinstance(root, jobfiles.LogRoot):
        verdict = _read_json(root, [*names, HANG_FILE], refused)
        texts = _stack_texts(root, names, refused)
    culprit = item.get("culprit") or verdict.get("culprit") or {}
    by_rank: dict[str, Any] = culprit.get("by_rank") or {}
    ranks = sorted({*map(int, texts), *(int(r) for r in item.get("stacks", {})),
                    *(int(r) for r in by_rank)})
    item = dict(item)
    item["cleared_at"] = verdict.get("cleared_at")
    item["stacks_dir"] = (str(root.under(*names)) if names is not None
                          and isinstance(root, jobfiles.LogRoot) else None)
    item["refused"] = refused
    item["ranks"] = [{
        "rank": r, "doing": by_rank.get(str(r)), "culprit": culprit.get("rank") == r,
        "text": texts.get(r), "frames": item.get("stacks", {}).get(str(r), []),
        "error": item.get("stack_errors", {}).get(str(r)),
    } for r in ranks]
    return item


def _read(root: jobfiles.LogRoot, names: list[str], limit: int,
          refused: list[str]) -> bytes | None:
    """Up to `limit` bytes of a file below the log dir; None when absent or refused (the
    refusal noted)."""
    try:
        fd = jobfiles.open_file(root, names)
    except jobfiles.Refused as e:
        refused.append(str(e))
        return None
    except OSError:
        return None
    with open(fd, "rb") as fh:
        return fh.read(limit)


def _stack_texts(root: jobfiles.LogRoot, names: list[str], refused: list[str]) -> dict[int, str]:
    texts: dict[int, str] = {}
    try:
        files = sorted(name for name, _ in jobfiles.entries(root, names))
    except jobfiles.Refused as e:
        refused.append(str(e))
        return texts
    for f in files:
        m = _RANK_FILE.fullmatch(f)
        if m is None:
            continue
        raw = _read(root, [*names, f], MAX_STACK_BYTES + 1, refused)
        if raw is None:
            continue
        text = raw[:MAX_STACK_BYTES].decode("utf-8", errors="replace")
        texts[int(m.group(1))] = text + ("\n... (cut)" if len(raw) > MAX_STACK_BYTES else "")
    return texts


def _read_json(root: jobfiles.LogRoot, names: list[str], refused: list[str]) -> dict[str, Any]:
    raw = _read(root, names, MAX_STACK_BYTES, refused)
    try:
        doc = json.loads(raw) if raw is not None else {}
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}
