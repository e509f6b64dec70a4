"""The chaos run (issue 16, item 4): a multi-node job under a seeded stream of real faults.

    python -m tests.chaos.run --minutes 10 --seed 1 --fault-rate 1      # make chaos
    (tests/chaos/test_chaos.py runs a short variant in make test)

A 2-node x 2-rank job with a spare (local backend, DDP over gloo, examples/train_ddp.py with
memory snapshots every step and durable checkpoints on S3) runs twice with the same
arguments: once without faults (the reference: per-step weight digests and its wall time),
then under faults drawn from `random.Random(seed)` at `--fault-rate` per minute. The design
(which part each fault breaks, what counts as recovered) is in docs/chaos.md. Prints a table
(or `--json`) and exits 1 when an invariant is broken: a wrong resume, an orphan, leaked
shared memory, an unrecovered fault, or a job that did not succeed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tests.chaos.faults import KINDS, Chaos, Fault
from tests.chaos.parts import S3, TAG, Digests, Tmpfs, describe, tagged

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "train_ddp.py"
TG = [sys.executable, "-m", "trainguard"]
RANKS = 4


@dataclass
class Config:
    minutes: float = 10.0  # the fault stream lasts this long (or until the job ends)
    seed: int = 1
    fault_rate: float = 1.0  # faults per minute (exponential gaps)
    kinds: tuple[str, ...] = KINDS
    order: tuple[str, ...] = ()  # these kinds first, in this order (the short variant)
    max_faults: int = 0  # stop the stream after this many (0: no limit)
    steps: int = 1500
    step_time: float = 0.2
    ckpt_every: int = 20
    spares: int = 1
    # a fixed hang threshold: on a shared 2-CPU machine (load 10-24) steps stall for
    # seconds now and then; 20 s clears them
    hang_timeout: float = 20.0
    standby: bool = True
    first_fault_after: float = 20.0  # seconds after the first step
    outage_s: float = 15.0  # a full disk or a dead S3 server lasts this long
    requeue_delay_s: float = 3.0  # a killed controller is started again after this
    recover_timeout_s: float = 240.0
    # the reference run: "same" (the same job without faults: its wall time is ETTR's
    # numerator) or "one-node" (4 ranks on one node, local checkpoints, no snapshots: the
    # same weights at every step, sooner; the short variant, which does not report ETTR)
    reference: str = "same"


@dataclass
class Run:
    """One run of the job (the reference or the chaos run)."""

    name: str
    job_dir: Path
    digests: Digests
    prefix: str
    tag: str = field(default_factory=lambda: uuid.uuid4().hex)
    launched: float = 0.0
    ended: float = 0.0
    exit_code: int | None = None
    launches: int = 0
    proc: subprocess.Popen[bytes] | None = None
    markers: set[str] = field(default_factory=set)


class Harness:
    """The mounts, the S3 server and the job's command line, shared by both runs."""

    def __init__(self, cfg: Config, work: Path) -> None:
        self.cfg, self.work = cfg, work
        self.jobfs = Tmpfs(work / "jobfs", 64)
        self.shmfs = Tmpfs(work / "shmfs", 64)
        self.s3 = S3(bucket="chaos")
        self.s3.start()
        self.s3.fs().mkdir(self.s3.bucket)

    def close(self) -> None:
        self.s3.kill()
        self.jobfs.unmount()
        self.shmfs.unmount()

    def new_run(self, name: str) -> Run:
        return Run(name, self.jobfs.path / name, Digests(self.work / f"digests-{name}", RANKS),
                   prefix=name)

    def argv(self, run: Run) -> list[str]:
        c = self.cfg
        one_node = run.name == "reference" and c.reference == "one-node"
        # the one-node reference's steps do not sleep: a step's sleep changes no weight
        script = [str(EXAMPLE), "--steps", str(c.steps),
                  "--step-time", "0" if one_node else str(c.step_time),
                  "--ckpt-every", str(c.ckpt_every), "--progress", "--quiet", "--fixed-buckets",
                  "--digest-log", str(run.digests.path)]
        if one_node:
            return [*TG, "run", "--nproc-per-node", "4", "--job-dir", str(run.job_dir),
                    "--no-standby-workers", *script]
        return [*TG, "run", "--nnodes", "2", "--nproc-per-node", "2",
                "--spare-nodes", str(c.spares), "--backend", "local", "--run-id", run.name,
                "--job-dir", str(run.job_dir),
                "--checkpoint-dir", f"s3://{self.s3.bucket}/{run.prefix}",
                "--max-restarts", "128", "--restart-backoff", "0", "--grace-period", "2",
                "--restart-on-hang", "--hang-timeout", str(c.hang_timeout),
                "--memory-every", "1", "--min-free-disk-mb", "4", "--queue-timeout", "120",
                *([] if c.standby else ["--no-standby-workers"]), *script]

    def env(self, run: Run) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "TRAINGUARD_FAULT"}
        env.update(self.s3.env())
        env["TRAINGUARD_SHM_ROOT"] = str(self.shmfs.path)
        env[TAG] = run.tag
        return env

    def launch(self, run: Run) -> None:
        """Start the launcher: the first time, or again after a kill (a requeue: the same
        command and job dir)."""
        if not run.launched:
            run.launched = time.time()
        run.launches += 1
        with open(self.work / f"console-{run.name}.log", "ab") as out:
            run.proc = subprocess.Popen(self.argv(run), cwd=self.work, env=self.env(run),
                                        stdout=out, stderr=subprocess.STDOUT)

    def note_markers(self, run: Run) -> None:
        for name in self.shmfs.entries():
            run.markers.add(name)

    def status(self, run: Run) -> dict[str, Any] | None:
        r = subprocess.run([*TG, "status", str(run.job_dir), "--json"], capture_output=True,
                           text=True, timeout=60, check=False)
        try:
            out = json.loads(r.stdout)
        except ValueError:
            return None
        return out if isinstance(out, dict) else None


def wait_for_end(h: Harness, run: Run, timeout_s: float) -> None:
    assert run.proc is not None
    deadline = time.monotonic() + timeout_s
    while run.proc.poll() is None and time.monotonic() < deadline:
        h.note_markers(run)
        time.sleep(0.5)
    if run.proc.poll() is None:
        run.proc.send_signal(signal.SIGTERM)
        run.proc.wait(timeout=60)
    run.exit_code = run.proc.returncode
    run.ended = time.time()


def leftovers(h: Harness, run: Run, wait_s: float = 30.0) -> tuple[list[str], list[str]]:
    """(orphans, leaked shared memory) once the job ended: processes still carrying the
    run's tag after `wait_s`, and regions left in the shm mount or in /dev/shm."""
    deadline = time.monotonic() + wait_s
    while tagged(run.tag) and time.monotonic() < deadline:
        time.sleep(0.5)
    orphans = describe(tagged(run.tag))
    leaked = [f"{h.shmfs.path}/{n}" for n in h.shmfs.entries()]
    markers = {m.split("-")[1] for m in run.markers if m.count("-") >= 2}
    with_marker = [f"/dev/shm/{n}" for n in os.listdir("/dev/shm")
                   if any(m in n for m in markers)]
    return orphans, leaked + with_marker


def wall_to_last_step(run: Run, steps: int) -> float:
    done = [ln.at for ln in run.digests.lines(0) if ln.kind == "step" and ln.step == steps]
    return (max(done) if done else run.ended) - run.launched


def check_digests(ref: Run, run: Run, steps: int) -> dict[str, Any]:
    """Every digest the chaos run wrote against the reference's at the same step."""
    want = ref.digests.by_step(0)
    want[0] = next((ln.digest for ln in ref.digests.lines(0) if ln.kind == "start"), "")
    resumes, wrong, mismatches, redone = 0, [], 0, 0
    for rank in range(RANKS):
        lines = run.digests.lines(rank)
        bad_pids = {ln.pid for ln in lines if want.get(ln.step, ln.digest) != ln.digest}
        mismatches += sum(1 for ln in lines if want.get(ln.step, ln.digest) != ln.digest)
        for ln in lines:
            if ln.kind == "start" and ln.step > 0:
                resumes += 1
                if ln.pid in bad_pids:
                    wrong.append(f"rank {rank} pid {ln.pid} resumed at {ln.step}")
        if rank == 0:
            redone = sum(1 for ln in lines if ln.kind == "step") - steps
    final = {ln.digest for ln in run.digests.lines(0) if ln.kind == "step" and ln.step == steps}
    return {"resumes_checked": resumes, "wrong_resumes": len(wrong), "wrong": wrong,
            "digest_mismatches": mismatches, "steps_lost": max(0, redone),
            "final_weights_equal": final == {want.get(steps)}}


def reference(h: Harness) -> Run:
    ref = h.new_run("reference")
    h.launch(ref)
    wait_for_end(h, ref, timeout_s=h.cfg.steps * 3 + 600)
    if ref.exit_code != 0 or h.cfg.steps not in ref.digests.by_step(0):
        raise RuntimeError(f"the fault-free reference run failed (exit {ref.exit_code}); "
                           f"see {h.work}/console-reference.log")
    return ref


def chaos(h: Harness, ref: Run) -> dict[str, Any]:
    run = h.new_run("chaos")
    h.launch(run)
    engine = Chaos(h, run, random.Random(h.cfg.seed))
    faults: list[Fault] = engine.drive()
    assert run.proc is not None
    wait_for_end(h, run, timeout_s=h.cfg.steps * 3 + 600)
    orphans, leaked = leftovers(h, run)
    checked = check_digests(ref, run, h.cfg.steps)
    ref_wall, chaos_wall = wall_to_last_step(ref, h.cfg.steps), wall_to_last_step(run, h.cfg.steps)
    by_kind: dict[str, dict[str, Any]] = {}
    for f in faults:
        k = by_kind.setdefault(f.kind, {"injected": 0, "recovered": 0, "recovery_s": []})
        k["injected"] += 1
        if f.recovered_at is not None:
            k["recovered"] += 1
            k["recovery_s"].append(round(f.recovered_at - f.at, 1))
    return {
        "seed": h.cfg.seed, "fault_rate_per_min": h.cfg.fault_rate, "steps": h.cfg.steps,
        "job_exit_code": run.exit_code, "launches": run.launches,
        "faults_injected": len(faults),
        "faults_recovered": sum(1 for f in faults if f.recovered_at is not None),
        "by_kind": by_kind, **checked, "orphans": len(orphans), "orphan_processes": orphans,
        "leaked_shm": len(leaked), "leaked_shm_paths": leaked,
        "reference_wall_s": round(ref_wall, 1), "chaos_wall_s": round(chaos_wall, 1),
        "ettr": round(ref_wall / chaos_wall, 3) if chaos_wall > 0 else 0.0,
        "faults": [asdict(f) for f in faults],
    }


def ok(result: dict[str, Any]) -> bool:
    return (result["job_exit_code"] == 0 and result["wrong_resumes"] == 0
            and result["digest_mismatches"] == 0 and result["final_weights_equal"]
            and result["orphans"] == 0 and result["leaked_shm"] == 0
            and result["faults_recovered"] == result["faults_injected"])


def table(result: dict[str, Any], load: str) -> str:
    rows = [("faults injected", result["faults_injected"]),
            ("faults recovered", result["faults_recovered"])]
    for kind, k in sorted(result["by_kind"].items()):
        med = statistics.median(k["recovery_s"]) if k["recovery_s"] else "-"
        rows.append((f"  {kind}", f"{k['recovered']}/{k['injected']} recovered, "
                                  f"median {med} s to a new step"))
    rows += [("resumes checked bit for bit", result["resumes_checked"]),
             ("wrong resumes", result["wrong_resumes"]),
             ("digests that differ from the reference", result["digest_mismatches"]),
             ("final weights equal to the reference", result["final_weights_equal"]),
             ("steps lost (done again)", result["steps_lost"]),
             ("orphan processes left", result["orphans"]),
             ("leaked shared memory regions", result["leaked_shm"]),
             ("job exit code (launches)", f"{result['job_exit_code']} "
                                          f"({result['launches']})"),
             ("fault-free wall time (s)", result["reference_wall_s"]),
             ("chaos wall time (s)", result["chaos_wall_s"]),
             ("ETTR (fault-free / chaos)", result["ettr"])]
    width = max(len(r[0]) for r in rows)
    lines = [f"chaos run: seed {result['seed']}, {result['fault_rate_per_min']} fault(s)/min, "
             f"{result['steps']} steps, load {load}"]
    lines += [f"{name.ljust(width)}  {value}" for name, value in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--fault-rate", type=float, default=1.0, help="faults per minute")
    p.add_argument("--steps", type=int, default=0,
                   help="training steps (default: about --minutes of fault-free training)")
    p.add_argument("--step-time", type=float, default=0.2)
    p.add_argument("--kinds", default=",".join(KINDS), help="fault kinds, comma-separated")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--keep", action="store_true", help="keep the work dir")
    ns = p.parse_args(argv)
    kinds = tuple(k for k in ns.kinds.split(",") if k)
    unknown = set(kinds) - set(KINDS)
    if unknown:
        p.error(f"unknown fault kind(s) {sorted(unknown)}; known: {', '.join(KINDS)}")
    steps = ns.steps or int(ns.minutes * 60 / (ns.step_time + 0.1))
    cfg = Config(minutes=ns.minutes, seed=ns.seed, fault_rate=ns.fault_rate, kinds=kinds,
                 steps=steps, step_time=ns.step_time)
    result = run_chaos(cfg, keep=ns.keep)
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(json.dumps(result, indent=1) if ns.json else table(result, load), flush=True)
    return 0 if ok(result) else 1


def run_chaos(cfg: Config, keep: bool = False, work: Path | None = None) -> dict[str, Any]:
    """Both runs in `work` (a temporary dir, removed unless `keep`, when not given; its
    result.json, consoles and digest files stay when it is given)."""
    own = work is None
    work = work or Path(tempfile.mkdtemp(prefix="tg-chaos-"))
    h = Harness(cfg, work)
    try:
        ref = reference(h)
        shutil.rmtree(ref.job_dir, ignore_errors=True)  # room on the job-dir mount
        result = chaos(h, ref)
        result["work_dir"] = str(work)
        (work / "result.json").write_text(json.dumps(result, indent=1))
        return result
    finally:
        h.close()
        if own and not keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
