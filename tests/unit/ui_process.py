"""The real `trainguard ui` process, for the dashboard's security tests: what uvicorn does
with a request (proxy headers, its thread pool, tracebacks in its log) is only seen there."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.unit.helpers import TG


@contextmanager
def running_ui(*jobs: Path, root: Path | None = None
               ) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """`trainguard ui JOB... [--root ROOT] --port 0` (no token, loopback): the process and
    its port."""
    where = [*map(str, jobs), *(["--root", str(root)] if root is not None else [])]
    proc = subprocess.Popen([*TG, "ui", *where, "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        m = re.search(r":(\d+)/", line)
        if m is None:
            proc.kill()
            pytest.fail(f"trainguard ui printed no URL: {line!r}; stderr: "
                        f"{proc.communicate(timeout=10)[1][-2000:]}")
        yield proc, int(m.group(1))
    finally:
        proc.terminate()
        proc.wait(10)


def stderr_after_stop(proc: subprocess.Popen[str]) -> str:
    """Stop the dashboard and return what it wrote to stderr."""
    proc.terminate()
    return proc.communicate(timeout=10)[1]
