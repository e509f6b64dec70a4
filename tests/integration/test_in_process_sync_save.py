"""Walk-through 34 #8 (critical): a survivor inside a synchronous checkpoint save when its
peer dies. Rank 0 waited in the save's commit for the dead rank's part (a storage poll, not
a collective: nothing broke it) while the in-process restart's replacement waited for rank 0
in the new group: the job trained nothing for minutes, `running`, no hang suspected. The
wait now takes the launcher's RESTART and leaves for run_resilient.

Real `trainguard run`, 2 real ranks over gloo, a real Checkpointer(async_save=False) and a
real SIGKILL of rank 1 while rank 0 waits in step 3's save."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.integration.conftest import read_json, reasons, run_tg

pytestmark = pytest.mark.integration

SCRIPT = """
import os, signal, time
import torch
import torch.distributed as dist
import trainguard
from trainguard.checkpoint import Checkpointer

def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    state = {"w": torch.zeros(4)}
    ckpt = Checkpointer(os.environ["TRAINGUARD_CHECKPOINT_DIR"], every_steps=1,
                        async_save=False)
    start = ckpt.load_latest(state) or 0
    first = os.environ.get("TRAINGUARD_PROCESS_START_COUNT", "1") == "1"
    for step in range(start + 1, 7):
        t = torch.full((4,), float(step))
        dist.all_reduce(t)
        state["w"] = state["w"] + t
        print(f"step {step}", flush=True)
        if step == 3 and rank == 1 and first:
            time.sleep(1.0)  # rank 0 waits in the save for this rank's part by now
            os.kill(os.getpid(), signal.SIGKILL)
        ckpt.save(step, state)
    ckpt.close()
    print(f"done w {state['w'].tolist()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()

trainguard.run_resilient(main)
"""


def test_a_survivor_waiting_in_a_synchronous_save_restarts_in_place(tmp_path: Path) -> None:
    script = tmp_path / "sync_save.py"
    script.write_text(SCRIPT)
    job = tmp_path / "job"
    r = run_tg(["run", "--nproc-per-node", "2", "--max-restarts", "2", "--job-dir", str(job),
                str(script)], cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    # every step counted once: 2 x (1 + ... + 6), the steps after the kill run again from
    # step 2's checkpoint on both ranks
    done = re.findall(r"^\[rank \d\] done w (.*)$", r.stdout, re.M)
    assert done == ["[42.0, 42.0, 42.0, 42.0]"] * 2, r.stdout[-2000:]
    got = reasons(job)
    assert got.index("WorkerFailed") < got.index("InProcessRestarting") < got.index(
        "InProcessRestarted"), got
    assert "WorkersRestarted" not in got
    (rr,) = read_json("recovery", job)["running_records"][0]["recover_records"]
    assert (rr["recover"], rr["recover_result"], rr["resumed_step"]) == (
        "in_process_restart", "success", 2), rr
    # the wait was left at the RESTART (its poll: at most 0.5 s), not after the commit's 300 s
    assert rr["durations_s"]["total"] < 30, rr
