"""What a memory snapshot's tail costs (docs/fast-recovery.md, "Tails").

Runs the example DDP job (examples/train_ddp.py, 1 node x 2 ranks, gloo, CPU) under
`trainguard run --memory-every 1 --step-time 0.5`, and, while it trains, reads the ranks'
tails from its shared-memory region the way a node agent answers the controller
(node/peer.py `tails`): first full (every tensor up to 16 KiB), then, once the small
tensors that differ between the two ranks are known (compared at the same step, as the
controller learns them), only those. Prints per rank and step: the tensors, the bytes of
the state, of the full tail and of the tail as sent from then on (JSON, as on the wire),
the time one `tails` call takes on this machine, and the CPU the node's side of the asks
takes when they come every 20 ms for --seconds (a node answers with bytes only when a
step is newer, and reads a manifest again only when it changed).

    .venv/bin/python benchmarks/peer_tails.py [--repeats 50]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trainguard.node import peer

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "train_ddp.py"
TG = [sys.executable, "-m", "trainguard"]


def region_of(shm: Path, timeout_s: float = 120) -> Path:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        regions = [p for p in shm.iterdir() if p.is_dir()] if shm.is_dir() else []
        if regions and len(peer.tails(regions[0], {})) == 2:
            return regions[0]
        time.sleep(0.5)
    raise SystemExit("no memory snapshots of both ranks appeared")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=50, help="tails calls timed (50)")
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="how long the asks every 20 ms are measured (10)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tg-tails-") as tmp:
        work, shm = Path(tmp), Path(tmp) / "shm"
        shm.mkdir()
        env = {**os.environ, "TRAINGUARD_SHM_ROOT": str(shm)}
        job = subprocess.Popen(
            [*TG, "run", "--nproc-per-node", "2", "--memory-every", "1", "--job-dir",
             str(work / "job"), str(EXAMPLE), "--steps", "400", "--step-time", "0.5",
             "--quiet", "--ckpt-every", "1000"], cwd=work, env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            region = region_of(shm)
            full = peer.tails(region, {})
            while len({t["entry"]["step"] for t in full.values()}) != 1:  # the same step
                time.sleep(0.05)
                full = peer.tails(region, {})
            parts = [dict((i, b) for i, b in t["small"]) for t in full.values()]
            differ = sorted(i for i in parts[0] if len({p[i] for p in parts}) > 1)
            only = peer.tails(region, {}, differ)
            timings = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                peer.tails(region, {}, differ)
                timings.append(time.perf_counter() - t0)
                time.sleep(0.02)
            # the node's side of the controller's asks, as they come: every 20 ms, with the
            # generations it has, for --seconds; the CPU this process spent on them
            have: dict[int, int] = {}
            sent = 0
            cpu0, wall0 = time.process_time(), time.monotonic()
            while time.monotonic() - wall0 < args.seconds:
                for rank, tail in peer.tails(region, have, differ).items():
                    have[rank] = int(tail["entry"]["generation"])
                    sent += 1
                time.sleep(0.02)
            cpu = (time.process_time() - cpu0) / (time.monotonic() - wall0)
            entry = full[0]["entry"]
            print(f"command: .venv/bin/python benchmarks/peer_tails.py --repeats {args.repeats} "
                  f"--seconds {args.seconds:g}")
            print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
            print("job: examples/train_ddp.py, 1 node x 2 ranks, --memory-every 1 --step-time "
                  f"0.5; step {entry['step']}")
            print(f"state per rank: {len(entry['tensors'])} tensors, {entry['size']} bytes")
            kinds = [(i, entry["tensors"][i]["dtype"], entry["tensors"][i]["shape"])
                     for i in differ]
            print(f"small tensors (<= {peer.SMALL_TENSOR_BYTES} bytes): "
                  f"{len(full[0]['small'])}; differing between the ranks: {kinds}")
            for rank in sorted(full):
                print(f"rank {rank}: full tail {len(json.dumps(full[rank]))} bytes of JSON; "
                      f"tail as sent once learnt {len(json.dumps(only[rank]))} bytes "
                      f"(its manifest entry {len(json.dumps(only[rank]['entry']))})")
            print(f"one tails call (both ranks, a newer step): median "
                  f"{statistics.median(timings) * 1000:.2f} ms, max {max(timings) * 1000:.2f} ms")
            print(f"asked every 20 ms for {args.seconds:.0f} s (0.5 s steps): {sent} tails sent, "
                  f"the node's CPU {cpu * 100:.2f}% of one core")
        finally:
            job.terminate()
            job.wait(timeout=60)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
