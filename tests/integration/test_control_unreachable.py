"""A rank that cannot hand its agent the way to its inbox (its open-file limit reached when
`run_resilient` starts) runs on without the lower rungs, and the job's events say so: a
`ControlUnreachable` Warning naming the rank and the error (its console only, before)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.integration.conftest import TG, read_json

pytestmark = pytest.mark.integration

SCRIPT = """
import errno, os, resource, time
import trainguard

def main():
    for step in range(1, 4):
        trainguard.progress(step)
        time.sleep(0.05)

trainguard.progress(0)  # the channel's socket is made here; the inbox is not yet
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (max(map(int, os.listdir("/proc/self/fd"))) + 16,
                                            hard))
held = []
try:
    while True:
        held.append(os.open(os.devnull, os.O_RDONLY))
except OSError as e:
    assert e.errno == errno.EMFILE, e
try:
    trainguard.run_resilient(lambda: None)  # makes the inbox: no fd left for its socket pair
finally:
    for fd in held:
        os.close(fd)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
trainguard.run_resilient(main)
"""


def test_a_rank_at_its_open_file_limit_is_told_as_control_unreachable(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    job = tmp_path / "job"
    r = subprocess.run([*TG, "run", "--nproc-per-node", "1", "--job-dir", str(job),
                        str(script)], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "cannot hand the agent a way to reach this process ([Errno 24] Too many open " \
           "files)" in r.stdout + r.stderr
    told = [e for e in read_json("events", job) if e["reason"] == "ControlUnreachable"]
    assert len(told) == 1, json.dumps(read_json("events", job), indent=1)[-3000:]
    assert told[0]["level"] == "Warning" and told[0]["message"] == (
        "rank 0's agent cannot reach its process ([Errno 24] Too many open files): off in "
        "that process: step re-execution, in-process restart")
