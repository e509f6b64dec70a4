"""The rank log line format, `<ISO time read> <out|err> <text>`. Pure."""

from __future__ import annotations

from datetime import datetime


def stamp_lines(stamp: str, stream: str, texts: list[str]) -> list[str]:
    return [f"{stamp} {stream} {t}" for t in texts]


def parse_stamped(line: str) -> tuple[datetime | None, str, str]:
    """Split a rank log line into (time read, stream, text); tolerant of foreign lines."""
    parts = line.rstrip("\n").split(" ", 2)
    if len(parts) >= 2 and parts[1] in ("out", "err") and len(parts[0]) >= 19:
        try:
            return datetime.fromisoformat(parts[0]), parts[1], parts[2] if len(parts) > 2 else ""
        except ValueError:
            pass
    return None, "", line.rstrip("\n")
