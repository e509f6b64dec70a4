"""`make demo`: a 2-rank DDP job that survives three injected faults, then its recovery report.

1. rank 1 is killed with SIGKILL after step 45 (it sends it to itself, as an outside kill
   would look): conditional auto restart brings the job back from its last checkpoint (step
   40);
2. on the next attempt rank 0 prints a transient NCCL error and exits 1 after step 75:
   diagnosed as a communication error (restart helps), restarted again from step 70;
3. on the third attempt rank 1 hangs (sleeps forever) after step 85 while rank 0 waits for
   it in the next allreduce: the hang is confirmed in seconds, both ranks' stacks are
   dumped, rank 1 is named, and the job is restarted in place (restart upon suspension)
   from step 80.
The job then finishes; the events, the recovery records, the diagnosis of the hung attempt
and the goodput report show what happened, and the last line is the `trainguard ui` command
that shows it in a browser.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRAINGUARD = [sys.executable, "-m", "trainguard"]

FAULTS = ";".join([
    "signal:KILL@rank=1,step=45,attempt=0",
    "log:RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO)"
    "@rank=0,step=75,attempt=1",
    "exit:1@rank=0,step=75,attempt=1",
    "hang@rank=1,step=85,attempt=2",
])


def main() -> int:
    job_dir = Path(os.environ.get("DEMO_JOB_DIR") or tempfile.mkdtemp(prefix="trainguard-demo-"))
    env = dict(os.environ, TRAINGUARD_FAULT=FAULTS)
    cmd = [*TRAINGUARD, "run", "--scenario", "single-node", "--nproc-per-node", "2",
           "--restart-on-hang", "--job-dir", str(job_dir), "--local-ranks-filter", "0",
           str(HERE / "train_ddp.py"), "--steps", "100", "--ckpt-every", "10"]
    print("$ TRAINGUARD_FAULT='...' " + " ".join(cmd[2:]), flush=True)
    code = subprocess.call(cmd, env=env)
    for read in (["events", str(job_dir)], ["recovery", str(job_dir)],
                 ["diagnose", str(job_dir), "--attempt", "2"], ["report", str(job_dir)]):
        print(f"\n$ trainguard {' '.join(read)}", flush=True)
        subprocess.call([*TRAINGUARD, *read])
    verdict = "succeeded" if code == 0 else f"FAILED with exit code {code}"
    print(f"\nThe demo job {verdict}; job dir: {job_dir}")
    print(f"See it in a browser: .venv/bin/trainguard ui {job_dir}  (then open the URL it "
          "prints; Ctrl-C stops it)")
    return code


if __name__ == "__main__":
    sys.exit(main())
