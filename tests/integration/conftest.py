"""Helpers for integration tests: the real `trainguard` command, real worker processes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "train_ddp.py"
TG = [sys.executable, "-m", "trainguard"]


def run_tg(args: list[str], *, cwd: Path, fault: str | None = None, timeout: float = 180,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    e = dict(os.environ)
    e.pop("TRAINGUARD_FAULT", None)
    if fault:
        e["TRAINGUARD_FAULT"] = fault
    e.update(env or {})
    return subprocess.run([*TG, *args], cwd=cwd, env=e, capture_output=True, text=True,
                          timeout=timeout, check=False)


def read_json(cmd: str, job_dir: Path) -> Any:
    out = subprocess.run([*TG, cmd, str(job_dir), "--json"], capture_output=True, text=True,
                         check=True, timeout=60)
    return json.loads(out.stdout)


def reasons(job_dir: Path) -> list[str]:
    return [e["reason"] for e in read_json("events", job_dir)]


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


def trainer_result(stdout: str) -> tuple[list[list[float]], str]:
    """The `losses [...]` and `weights sha256 HEX` lines rank 0 of a trainer example prints."""
    losses = re.findall(r"^\[rank 0\] losses (\[.*\])$", stdout, re.M)
    digest = re.findall(r"^\[rank 0\] weights sha256 ([0-9a-f]{64})$", stdout, re.M)
    assert len(losses) == 1 and len(digest) == 1, stdout[-3000:]
    return json.loads(losses[0]), digest[0]


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    return tmp_path / "job"


@pytest.fixture(scope="session")
def clean_digest(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The final weights (SHA-256) of the example DDP job, 2 ranks, 14 steps, a checkpoint
    every 4, without any fault: what every exact recovery of that job must end with."""
    tmp = tmp_path_factory.mktemp("clean")
    r = run_tg(["run", "--nproc-per-node", "2", "--job-dir", str(tmp / "job"), str(EXAMPLE),
                "--steps", "14", "--ckpt-every", "4", "--digest"], cwd=tmp)
    assert r.returncode == 0, r.stderr[-3000:]
    found = re.findall(r"weights sha256 ([0-9a-f]{64})", r.stdout)
    assert len(found) == 1, r.stdout[-2000:]
    return str(found[0])
