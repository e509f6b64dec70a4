"""A rank that caught a CUDA OOM, skipped the batch and trained on, then was killed: the job
is restarted, and `diagnose JOB_DIR` says what the launcher said (walk-through 20, finding 1:
the OOM, survived seconds before, was taken for the cause and the job was not restarted)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.conftest import read_json, run_tg

pytestmark = pytest.mark.integration

SCRIPT = """
import os, signal, time, traceback
import torch

first = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
for step in range(1, 26):
    if step == 5 and first:
        try:  # what torch raises when an allocation does not fit; the script skips the batch
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. "
                                         "GPU 0 has a total capacity of 79.15 GiB of which "
                                         "1.02 GiB is free.")
        except torch.OutOfMemoryError:
            traceback.print_exc()
            print("skipping this batch after OOM", flush=True)
            continue
    if step == 20 and first:
        os.kill(os.getpid(), signal.SIGKILL)  # an operator, a watchdog: not the OOM
    time.sleep(0.2)
    print(f"step {step} loss {1.0 / step:.3f}", flush=True)
"""


def test_an_oom_the_rank_trained_past_does_not_stop_the_restart(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    job = tmp_path / "job"
    r = run_tg(["run", "--nproc-per-node", "1", "--max-restarts", "2", "--job-dir", str(job),
                str(script)], cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    diagnosed = [e for e in read_json("events", job) if e["reason"] == "FailureDiagnosed"]
    assert len(diagnosed) == 1
    assert diagnosed[0]["data"]["category"] == "killed_by_signal_unknown", diagnosed[0]
    assert "OutOfMemoryError" in (job / "logs" / "attempt-0" / "rank-0.log").read_text()
    d = read_json("diagnose", job)
    assert d["attempt"] == 0 and d["diagnosis"]["category"] == "killed_by_signal_unknown", d
