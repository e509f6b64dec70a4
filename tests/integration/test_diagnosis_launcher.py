"""The launcher diagnoses every failed attempt with the same engine as `trainguard diagnose`.

Real `trainguard run`, real torch DDP over gloo; the faults print real error lines (a CUDA
OOM, an Xid 79) on one rank and exit, while the other rank dies of the broken collective.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import EXAMPLE, TG, read_json, reasons, run_tg

pytestmark = pytest.mark.integration

FAST = ["--restart-backoff", "0.1", "--grace-period", "5"]
OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a "
       "total capacity of 79.10 GiB of which 1.20 GiB is free.")
XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4121, GPU has fallen off the bus."


def ddp(job_dir: Path, *flags: str) -> list[str]:
    return ["run", "--nproc-per-node", "2", "--job-dir", str(job_dir), *FAST, *flags,
            str(EXAMPLE), "--steps", "30", "--ckpt-every", "10"]


def diagnosed(job_dir: Path) -> list[dict[str, Any]]:
    return [e for e in read_json("events", job_dir) if e["reason"] == "FailureDiagnosed"]


def diagnose_cli(*args: str) -> tuple[int, dict[str, Any]]:
    out = subprocess.run([*TG, "diagnose", *args, "--json"], capture_output=True, text=True,
                         timeout=60, check=False)
    return out.returncode, json.loads(out.stdout)


def test_an_oom_on_one_rank_is_the_root_cause_and_is_not_restarted(
        tmp_path: Path, job_dir: Path) -> None:
    r = run_tg(ddp(job_dir, "--max-restarts", "3"), cwd=tmp_path,
               fault=f"log:{OOM}@rank=1,step=12;exit:1@rank=1,step=12")
    assert r.returncode == 1, r.stderr[-3000:]
    got = reasons(job_dir)
    assert "RestartScheduled" not in got and got[-1] == "JobFailed"
    (ev,) = diagnosed(job_dir)
    d = ev["data"]
    assert (d["category"], d["restart_helps"], d["culprit"]["rank"]) == ("gpu_oom", "no", 1)
    assert d["evidence"]["file"] == "logs/attempt-0/rank-1.log"
    lines = (job_dir / d["evidence"]["file"]).read_text().splitlines()
    assert OOM in lines[d["evidence"]["line"] - 1]
    assert "gpu_oom" in ev["message"] and "logs/attempt-0/rank-1.log:" in ev["message"]
    rec = read_json("recovery", job_dir)["running_records"][0]["recover_records"][0]
    assert rec["category"] == "gpu_oom" and rec["related_task"] == "worker-1"
    assert rec["fault_scenario"] == "error_in_log"
    # the CLI reads the job dir and agrees with the launcher
    code, out = diagnose_cli(str(job_dir))
    assert code == 0 and out["attempt"] == 0
    assert out["diagnosis"]["category"] == "gpu_oom"
    assert out["diagnosis"]["culprit"]["rank"] == 1
    assert out["diagnosis"]["evidence"] == d["evidence"]


def test_a_gpu_fallen_off_the_bus_isolates_the_node_and_restarts(
        tmp_path: Path, job_dir: Path) -> None:
    r = run_tg(ddp(job_dir, "--max-restarts", "2"), cwd=tmp_path,
               fault=f"log:{XID}@rank=0,step=12;signal:ABRT@rank=0,step=12")
    assert r.returncode == 0, r.stderr[-3000:]
    (ev,) = diagnosed(job_dir)
    d = ev["data"]
    assert (d["category"], d["isolate_node"], d["restart_helps"]) == ("gpu_hardware", True, "yes")
    assert d["culprit"]["rank"] == 0
    assert "isolate node" in ev["message"]
    rec = read_json("recovery", job_dir)["running_records"][0]["recover_records"][0]
    assert rec["fault_scenario"] == "chip_fault" and rec["recover_result"] == "success"
