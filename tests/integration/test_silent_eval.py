"""A silent evaluation longer than the hang threshold is not a hang (walk-through 20,
finding 2): with restart upon suspension on (the multi-node and llm presets), a healthy job
whose evaluation printed nothing for 8 s was restarted as hung three times and failed (86).
Now the looks at its Python stack find it working: one attempt, no HangConfirmed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import read_json, run_tg
from trainguard.node.stacks import find_pyspy

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(find_pyspy() is None, reason="py-spy is not installed")]

SCRIPT = """
import time
import torch

def evaluate(model):  # work that prints nothing and marks no trainguard.phase
    with torch.no_grad():
        for _ in range(50):
            x = torch.randn(64, 256)
            float(model(x).sum())

model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
for step in range(1, 31):
    time.sleep(0.1)
    print(f"step {step} loss {1.0 / step:.3f}", flush=True)
    if step == 15:
        t = time.monotonic()
        while time.monotonic() - t < 16:  # twice the 8 s threshold
            evaluate(model)
"""


def run_job(tmp_path: Path, script: str, env: dict[str, str] | None = None
            ) -> list[dict[str, Any]]:
    """`script` run by `trainguard run --restart-on-hang` on one rank, to success: its
    events."""
    path = tmp_path / "train.py"
    path.write_text(script)
    job = tmp_path / "job"
    r = run_tg(["run", "--nproc-per-node", "1", "--restart-on-hang", "--job-dir", str(job),
                str(path)], cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    events: list[dict[str, Any]] = read_json("events", job)
    return events


# alone: beside a second job on 2 cores a look can take seconds, and too few of them land in
# the 2.7 s between the suspicion and the threshold (a make test run saw it confirmed)
@pytest.mark.serial
def test_a_silent_evaluation_is_not_restarted_as_a_hang(tmp_path: Path) -> None:
    events = run_job(tmp_path, SCRIPT)
    reasons = [e["reason"] for e in events]
    assert "HangConfirmed" not in reasons and "WorkersRestarted" not in reasons, reasons
    # its looks find it moving, or (a loaded machine's few looks all in torch's forward, its
    # CPU busy) computing: either is work
    working = [e for e in events if e["reason"] == "HangSuspected"
               and e["message"].startswith(("not confirmed: the Python stack of rank(s) 0 moves",
                                            "not confirmed: rank(s) 0 compute in a numeric"))]
    assert len(working) == 1 and 'trainguard.phase("eval")' in working[0]["message"], events
    assert reasons[-1] == "JobSucceeded"



GEMM_SCRIPT = """
import time
import torch

torch.set_num_threads(1)
model = torch.nn.Sequential(*[m for _ in range(6)
                              for m in (torch.nn.Linear(256, 256), torch.nn.GELU())])

def evaluate():  # GEMM-bound: its time goes to the forward's kernels, one place every look
    with torch.no_grad():
        t = time.monotonic()
        while time.monotonic() - t < 16:  # twice the 8 s threshold
            float(model(torch.randn(1024, 256)).mean())

for step in range(1, 31):
    time.sleep(0.1)
    print(f"step {step} loss {1.0 / step:.3f}", flush=True)
    if step == 15:
        evaluate()
"""


# make test-long only (23 s, alone): tests/unit/test_hang_compute.py holds the rule in make test
@pytest.mark.serial
@pytest.mark.long
def test_a_silent_evaluation_bound_by_its_kernels_is_not_restarted_as_a_hang(
        tmp_path: Path) -> None:
    """Walk-through 33 #2: found in torch's Linear.forward at every look (one place), it was
    confirmed hung at 8 s; with its CPU busy in a numeric library it works. The looks are
    samples (two can land at two places: `moves`), so the old code passed some runs: the
    rule itself is held by tests/unit/test_hang_compute.py."""
    events = run_job(tmp_path, GEMM_SCRIPT)
    reasons = [e["reason"] for e in events]
    assert "HangConfirmed" not in reasons and "WorkersRestarted" not in reasons, reasons
    working = [e for e in events if e["reason"] == "HangSuspected"
               and e["message"].startswith("not confirmed:")]
    assert len(working) == 1, working
    assert "rank(s) 0 compute in a numeric library (torch)" in working[0]["message"] or \
        "the Python stack of rank(s) 0 moves" in working[0]["message"], working
    assert reasons[-1] == "JobSucceeded"

LOADER_SCRIPT = """
import os, time
import torch
from torch.utils.data import DataLoader, Dataset

STUCK = os.environ["TRAINGUARD_ATTEMPT"] == "0" and os.environ.get("LOADER") == "stuck"
if os.environ.get("LOADER") == "stuck" and not STUCK:
    os.environ["LOADER"] = "stuck_then_none"  # the restarted attempt evaluates nothing

class Slow(Dataset):  # samples read from slow storage: the loader's workers wait, not compute
    def __len__(self):
        return 10_000
    def __getitem__(self, i):
        time.sleep(1e6 if STUCK else 0.2)
        return torch.randn(256)

model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
loader = DataLoader(Slow(), batch_size=4, num_workers=2)
for step in range(1, 31):
    time.sleep(0.1)
    print(f"step {step} loss {1.0 / step:.3f}", flush=True)
    if step == 15 and os.environ.get("LOADER") != "stuck_then_none":  # a silent evaluation:
        # the main thread waits in the loader for each batch
        t = time.monotonic()
        with torch.no_grad():
            for x in loader:
                float(model(x).sum())
                if time.monotonic() - t > 16:  # twice the 8 s threshold
                    break
"""


@pytest.mark.serial
def test_a_silent_evaluation_fed_by_a_data_loader_is_not_a_hang(tmp_path: Path) -> None:
    """Walk-through 28, finding 9: the main thread sits at one place (waiting in the loader),
    its workers sleep on slow storage (no CPU, no I/O): three restarts as hung, then 86."""
    events = run_job(tmp_path, LOADER_SCRIPT)
    reasons = [e["reason"] for e in events]
    assert "HangConfirmed" not in reasons and "WorkersRestarted" not in reasons, reasons
    working = [e for e in events if e["reason"] == "HangSuspected"
               and e["message"].startswith("not confirmed:")]
    assert len(working) == 1, working
    # the loader's batches, or, on a loaded machine whose looks land at two places of the
    # loader's code, a stack that moves (a fresh-clone make test saw it once right after the
    # parallel part): either is work, and neither a confirmation nor a restart came
    assert working[0]["message"].startswith((
        "not confirmed: rank(s) 0 wait in the data loader and get batches",
        "not confirmed: the Python stack of rank(s) 0 moves")) or \
        "rank(s) 0 wait in the data loader and get batches" in working[0]["message"], working
    assert reasons[-1] == "JobSucceeded"


def test_a_data_loader_whose_workers_are_stuck_is_confirmed_hung(tmp_path: Path) -> None:
    """The other side: the loader's workers never return a sample; the rank reads nothing,
    is confirmed hung in the data loader and restarted (the second attempt evaluates
    nothing). Not serial: a slow look on a loaded machine delays the confirmation only."""
    events = run_job(tmp_path, LOADER_SCRIPT, {"LOADER": "stuck"})
    confirmed = [e for e in events if e["reason"] == "HangConfirmed"]
    assert len(confirmed) == 1 and "in the data loader" in confirmed[0]["message"], confirmed
    assert not [e for e in events if e["reason"] == "HangSuspected"
                and e["message"].startswith("not confirmed:")]
    assert confirmed[0]["involved"]["attempt"] == 0 and events[-1]["reason"] == "JobSucceeded"


PHASE_SCRIPT = """
import os, time
import torch
import torch.distributed as dist
import trainguard

dist.init_process_group("gloo")
rank = dist.get_rank()
for step in range(1, 31):
    time.sleep(0.1)
    dist.all_reduce(torch.ones(1))
    if rank == 0:
        print(f"step {step} loss {1.0 / step:.3f}", flush=True)
    if step == 15:  # rank 0 evaluates, marked; rank 1 waits for it in the barrier
        if rank == 0:
            with trainguard.phase("eval"):
                time.sleep(16)  # twice the 8 s threshold
        dist.barrier()
dist.destroy_process_group()
"""


def test_ranks_waiting_in_a_barrier_for_a_marked_evaluation_are_not_a_hang(
        tmp_path: Path) -> None:
    """Walk-through 33 #1: rank 0's evaluation in `trainguard.phase("eval")`, rank 1 waiting
    for it in `dist.barrier()`: rank 1 was judged against T, confirmed hung at 8 s and the
    healthy job restarted. Not serial: no look decides it, only the phase."""
    path = tmp_path / "train.py"
    path.write_text(PHASE_SCRIPT)
    job = tmp_path / "job"
    r = run_tg(["run", "--nproc-per-node", "2", "--restart-on-hang", "--job-dir", str(job),
                str(path)], cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    reasons = [e["reason"] for e in read_json("events", job)]
    assert "HangConfirmed" not in reasons and "WorkersRestarted" not in reasons, reasons
    assert reasons[-1] == "JobSucceeded"
