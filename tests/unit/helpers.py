"""What the unit tests that run the real command or the real analysis share."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from trainguard.diagnosis.sources import diagnose_paths
from trainguard.diagnosis.taxonomy import Diagnosis

TG = [sys.executable, "-m", "trainguard"]


def tg(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
       timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`python -m trainguard ARGS`, its output captured, never raising on its exit code."""
    return subprocess.run([*TG, *args], capture_output=True, text=True, timeout=timeout,
                          check=False, cwd=cwd, env=env)


def diagnose_text(tmp_path: Path, text: str, name: str = "console.log") -> Diagnosis:
    """`trainguard diagnose` of one log holding `text`: an answer, with its deciding line."""
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    d = diagnose_paths([p]).diagnosis
    assert d is not None, "no diagnosis"
    assert d.evidence is not None and d.evidence.text, "an answer shows its deciding line"
    return d
