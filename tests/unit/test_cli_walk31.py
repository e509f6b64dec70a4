"""Walk-through 31 #8: `prune` deleted an ended job's dir that a running job checkpointed into
(`run --job-dir B --checkpoint-dir A/checkpoints`, continuing from A): B's committed
checkpoints went, without a word. A job dir holding what a running job uses (its job dir,
log dir or checkpoint dir) is now kept, with a note naming the job.

#13: `ckpt ls --json` rows of incomplete steps and malformed manifests lacked keys."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from tests.unit.helpers import TG, tg
from trainguard.cli.prune import Use, blocking, prune_summary
from trainguard.controller.store import JobStore


def _ended(job: Path, run_id: str, **meta: str) -> Path:
    """An ended job's store (ended long ago), its log dir and a committed step."""
    with JobStore.create(job, run_id) as s:
        s.set_meta(state="succeeded", job_dir=str(job), ended_at="2026-01-01T00:00:00+00:00",
                   **meta)
    (job / "logs" / "attempt-0").mkdir(parents=True)
    (job / "checkpoints" / "step-000000010").mkdir(parents=True)
    return job


def _running(job: Path, run_id: str, **meta: str) -> Path:
    """A job that reads running: its launcher (this test's process) is alive."""
    with JobStore.create(job, run_id) as s:
        s.set_meta(state="running", job_dir=str(job), launcher_pid=os.getpid(),
                   launcher_host=socket.gethostname(), **meta)
    return job


def test_a_dir_a_running_job_uses_blocks_its_deletion() -> None:
    a = Path("/r/A")
    delete = [a / "trainguard.db", a / "logs", a / "checkpoints"]
    ck = Use(Path("/r/B"), "b", "checkpoint dir", a / "checkpoints")
    assert blocking(a, delete, [ck]) == ck
    deeper = Use(Path("/r/B"), "b", "log dir", a / "checkpoints" / "b-logs")
    assert blocking(a, delete, [deeper]) == deeper
    whole = Use(Path("/r/B"), "b", "checkpoint dir", a)  # steps written into A's dir itself
    assert blocking(a, delete, [whole]) == whole
    # around the job dir (a checkpoint dir that is ROOT), beside it, or kept there: no
    around = Use(Path("/r/B"), "b", "checkpoint dir", Path("/r"))
    beside = Use(Path("/r/B"), "b", "job dir", Path("/r/B"))
    kept = Use(Path("/r/A/B"), "b", "job dir", a / "B")  # not among what is deleted
    assert blocking(a, delete, [around, beside, kept]) is None
    assert Use(Path("/r/B"), "b", "job dir", a, 7).said() == \
        "process 7, a worker of job b (/r/B), still runs and uses /r/A (its job dir)"


def test_the_summary_counts_the_jobs_kept() -> None:
    assert prune_summary(0, 0, "0 B", deleted=True, kept=1) == (
        "nothing to delete: 1 job ended more than 0 days ago, kept: a job that runs or ended "
        "since uses what it holds (see the note above)")
    assert prune_summary(2, 7, "1.0 MiB", deleted=False, kept=2) == (
        "2 jobs ended more than 7 days ago: 1.0 MiB to free; add --yes to delete them; 2 more "
        "jobs kept: a job that runs or ended since uses what they hold (see the note above)")
    assert prune_summary(0, 1, "0 B", deleted=False) == \
        "no job ended more than 1 day ago: nothing to delete"


def test_prune_keeps_what_running_jobs_use_wherever_it_lies(tmp_path: Path) -> None:
    """Stores as the launcher writes them (no job runs): B checkpoints into A's dir, C logs
    into D's, F's store lies inside E's log dir, G checkpoints into ROOT (blocks nothing), H
    is an ended job nothing uses, and J (outside ROOT) checkpoints into I's dir, which its
    owner mark says."""
    root = tmp_path / "runs"
    a, d, e, h = (_ended(root / n, f"run-{n}") for n in "ADEH")
    _running(root / "B", "run-B", checkpoint_dir=str(a / "checkpoints"))
    _running(root / "C", "run-C", log_dir=str(d / "logs" / "c"))
    _running(e / "logs" / "F", "run-F")
    _running(root / "G", "run-G", checkpoint_dir=str(root))
    i = _ended(root / "I", "run-I")  # J, outside ROOT, marked A's checkpoint dir as its own
    j = _running(tmp_path / "J", "run-J", checkpoint_dir=str(i / "checkpoints"))
    (i / "checkpoints" / ".trainguard-job").write_text(json.dumps({"job_dir": str(j)}))
    r = tg("prune", str(root), "--older-than", "1", "--yes")
    assert r.returncode == 0, r.stderr
    for job, user, what, path in ((a, "run-B", "checkpoint dir", a / "checkpoints"),
                                  (d, "run-C", "log dir", d / "logs" / "c"),
                                  (e, "run-F", "job dir", e / "logs" / "F"),
                                  (i, "run-J", "checkpoint dir", i / "checkpoints")):
        owner = path if what == "job dir" else j if user == "run-J" else root / user[-1]
        assert (f"trainguard prune: note: {job} is not deleted: the running job {user} "
                f"({owner}) uses {path} (its {what}), "
                "inside it. Fix: prune it once that job has ended") in r.stderr, r.stderr
        assert (job / "trainguard.db").is_file() and (job / "checkpoints").is_dir()
    assert not h.exists()
    last = r.stdout.splitlines()[-1]
    assert last.startswith("deleted 1 job that ended more than 1 day ago: ") and last.endswith(
        " freed; 4 more jobs kept: a job that runs or ended since uses what they hold (see the "
        "note above)"), last


def test_prune_keeps_the_ended_job_a_running_job_continues_from(tmp_path: Path) -> None:
    """The finding's pattern with a real running job B whose job dir lies outside ROOT (seen
    through its worker's environment) and whose checkpoints go to ended job A's dir."""
    a = _ended(tmp_path / "runs" / "A", "run-A")
    (tmp_path / "t.py").write_text(
        "import time\nfor s in range(1, 10**6):\n    print(f'step {s}', flush=True)\n"
        "    time.sleep(0.2)\n")
    proc = subprocess.Popen([*TG, "run", "--nproc-per-node", "1", "--job-dir", "other/B",
                             "--checkpoint-dir", str(a / "checkpoints"), "--grace-period", "2",
                             "t.py"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "step 1" in line:
                break
        r = tg("prune", str(tmp_path / "runs"), "--older-than", "0", "--yes")
        assert r.returncode == 0, r.stderr
        assert (f"{a} is not deleted: the running job ") in r.stderr, r.stderr
        assert (f"({tmp_path / 'other' / 'B'}) uses {a / 'checkpoints'} (its checkpoint "
                "dir)") in r.stderr, r.stderr
        assert (a / "checkpoints" / "step-000000010").is_dir()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


KEYS = {"step", "status", "reason", "world_size", "files", "bytes", "created_at", "latest"}


def test_ckpt_ls_json_rows_have_every_key(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Walk-through 31 #13: rows of an incomplete step and of a malformed manifest had 4 keys
    (no world_size, files, bytes, created_at), so a script's row["bytes"] raised KeyError;
    every row now has every key, null when unknown, and the table reads `-` for them."""
    import torch

    from trainguard.checkpoint import Checkpointer
    from trainguard.cli import main

    loc = tmp_path / "ck"
    ckpt = Checkpointer(loc, async_save=False, keep=10)
    for step in (10, 20):
        ckpt.save(step, {"w": torch.zeros(4)})
    ckpt.close()
    (loc / "step-000000030").mkdir()  # incomplete: no manifest
    with open(loc / "step-000000020" / "manifest.json", "a") as f:
        f.write("garbage\n")  # malformed
    assert main(["ckpt", "ls", str(loc), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["step"], r["status"]) for r in rows] == [
        (30, "incomplete"), (20, "corrupt"), (10, "valid")]
    assert all(set(r) == KEYS for r in rows), rows
    assert [r[k] for r in rows[:2] for k in ("world_size", "files", "bytes", "created_at")] \
        == [None] * 8
    assert rows[2]["world_size"] == 1 and rows[2]["bytes"] > 0
    assert main(["ckpt", "ls", str(loc)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[2].split()[:7] == ["30", "incomplete", "-", "-", "-", "-", "no"], table
