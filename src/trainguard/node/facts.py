"""Facts about an ended or running worker that the agent reads from the system: the
kernel's OOM-kill count, torch's error file, and a channel datagram as a WorkerMessage."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from trainguard.protocol import WorkerMessage
from trainguard.records import utcnow


def worker_message(raw: dict[str, Any]) -> WorkerMessage:
    at = raw.get("at")
    when = (datetime.fromtimestamp(at, timezone.utc) if isinstance(at, (int, float))
            else utcnow())
    rank = raw.get("rank")
    data = {k: v for k, v in raw.items() if k not in ("kind", "rank", "at")}
    return WorkerMessage(kind=str(raw["kind"]), rank=rank if isinstance(rank, int) else None,
                         at=when, data=data)


def oom_kill_count(vmstat: Path = Path("/proc/vmstat")) -> int | None:
    """The kernel's count of OOM kills since boot (Linux 4.13+); None where unknown."""
    try:
        for line in vmstat.read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def read_error_file(path: Path) -> dict[str, object] | None:
    """torch's @record error file, if the worker wrote one (unreadable -> None)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
