"""backends/orphans.py: which node agents outlive a dead launcher on Slurm, and ending them,
with fakes of squeue and scancel on PATH (the I/O layer; tests/multinode runs the real ones)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from trainguard.backends import orphans


@dataclass
class Row:
    name: str
    agent_pid: int | None = 1
    backend: str = "slurm"


def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, steps: str,
               delay_s: float = 0.0) -> Path:
    """squeue printing `steps` (after `delay_s`), scancel logging its argument."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    (bin_dir / "squeue").write_text(f"#!/bin/sh\necho squeue >> {calls}\nsleep {delay_s}\n"
                                    f"printf '{steps}'\n")
    (bin_dir / "scancel").write_text(f"#!/bin/sh\necho scancel $1 >> {calls}\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(orphans, "_steps_seen", {})
    return calls


def test_another_job_s_agents_in_the_same_allocation_are_not_this_job_s(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 52 #5: steps were named trainguard-agent-NODE; two jobs in one allocation saw,
    and `stop` scancelled, each other's agents."""
    calls = fake_slurm(tmp_path, monkeypatch,
                       "6.0 trainguard-b-agent-n1\\n6.1 trainguard-b-agent-n2\\n"
                       "6.4 trainguard-a-agent-n1\\n")
    meta = {"slurm_job_id": "6", "run_id": "a"}
    rows = [Row("n1"), Row("n2")]
    assert [r.name for r in orphans.running_agents(meta, rows)] == ["n1"]
    assert orphans.end_agents(meta, rows) == (["n1 (Slurm step 6.4)"], None)
    assert "scancel 6.4" in calls.read_text() and "scancel 6.0" not in calls.read_text()


def test_stop_cancels_trainguard_s_own_allocation_even_with_no_agent_step_left(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 52 #4: with no agent step listed (their orphan timeout passed), `stop` left
    the allocation trainguard had made RUNNING."""
    calls = fake_slurm(tmp_path, monkeypatch, "")
    meta = {"slurm_job_id": "7", "slurm_own_job": "7", "run_id": "a"}
    assert orphans.end_agents(meta, [Row("n1")]) == (["Slurm allocation 7"], None)
    assert "scancel 7\n" in calls.read_text()
    # one it did not make is never cancelled whole
    calls.write_text("")
    assert orphans.end_agents({"slurm_job_id": "8", "run_id": "a"}, [Row("n1")]) == ([], None)
    assert "scancel" not in calls.read_text()


def test_a_slow_squeue_s_answer_is_kept_for_the_next_callers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 52 #6: the entry was stamped before the call: a squeue of 2 s or more stored
    one expired already, and every dashboard push asked again."""
    calls = fake_slurm(tmp_path, monkeypatch, "6.4 trainguard-a-agent-n1\\n", delay_s=1.0)
    meta = {"slurm_job_id": "6", "run_id": "a"}
    monkeypatch.setattr(orphans, "STEPS_TTL_S", 0.5)  # shorter than the squeue itself
    assert [r.name for r in orphans.running_agents(meta, [Row("n1")])] == ["n1"]
    t0 = time.monotonic()
    assert [r.name for r in orphans.running_agents(meta, [Row("n1")])] == ["n1"]
    assert time.monotonic() - t0 < 0.3
    assert calls.read_text().count("squeue") == 1


def failing_squeue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, err: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text(f"#!/bin/sh\necho '{err}' >&2\nexit 1\n")
    (bin_dir / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(orphans, "_steps_seen", {})


def test_a_squeue_that_does_not_answer_is_not_every_agent_gone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 53 #6: a failing squeue read as no step: every node and rank `lost`."""
    failing_squeue(tmp_path, monkeypatch, "slurm_load_jobs error: Socket timed out on "
                   "send/recv operation")
    meta = {"slurm_job_id": "6", "run_id": "a"}
    assert orphans.running_agents(meta, [Row("n1")]) == []
    why = orphans.unanswered(meta, [Row("n1")])
    assert why is not None and why.startswith("Slurm could not be asked whether they run")
    assert "Socket timed out" in why
    assert orphans.unanswered(meta, [Row("n1", backend="local")]) is None  # no Slurm rows


def test_an_ended_job_s_id_is_an_answer_no_agent_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    failing_squeue(tmp_path, monkeypatch, "slurm_load_jobs error: Invalid job id specified")
    meta = {"slurm_job_id": "6", "run_id": "a"}
    assert orphans.running_agents(meta, [Row("n1")]) == []
    assert orphans.unanswered(meta, [Row("n1")]) is None
