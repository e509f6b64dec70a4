"""A real tmpfs for a test (a full disk, a read-only mount), shared by the test directories."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def mount_tmpfs(target: Path, options: str) -> Iterator[Path]:
    """A real tmpfs mounted at `target` (made here) for the test's duration; the test is
    skipped where mounting is not allowed (it needs root)."""
    target.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)],
                       capture_output=True, text=True, check=False)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.strip()}")
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False)
