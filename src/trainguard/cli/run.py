"""`trainguard run`: torchrun's flags (dash and underscore forms) plus trainguard's HA flags.

Only what the user typed reaches the spec (argparse.SUPPRESS defaults), so a job file
and a scenario preset can fill the rest. The script's own arguments pass through untouched.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import uuid
from pathlib import Path
from typing import Any

from trainguard.cli.dry_run import dry_run_doc
from trainguard.cli.fmt import complain
from trainguard.cli.job_file import load_job_file
from trainguard.cli.run_checks import (
    check_controller_host,
    check_fault_env,
    check_node_rank,
    note_flags_after_script,
    warn_shared_job_dir,
    worker_argv,
)
from trainguard.errors import SpecError
from trainguard.exitcodes import ExitCode
from trainguard.spec import PRESETS
from trainguard.spec_build import Built, build

S = argparse.SUPPRESS

# `run`'s own long flags, filled in by add_run_command (run_checks.note_flags_after_script)
_RUN_FLAGS: set[str] = set()
# flags torchrun has that name a mode this version does not run
_RDZV_OK = {"static", "c10d"}


def _flag(p: argparse.ArgumentParser | argparse._ArgumentGroup, name: str, *short: str,
          **kw: Any) -> None:
    """Add `--a-b` with its torchrun alias `--a_b` (and short forms)."""
    names = [*short, f"--{name}"]
    if "-" in name:
        names.append(f"--{name.replace('-', '_')}")
    p.add_argument(*names, default=S, **kw)


def _module_list(text: str) -> list[str]:
    """`a,b.c` -> ["a", "b.c"] (checked as module names by the job spec)."""
    return [m.strip() for m in text.split(",") if m.strip()]


def add_run_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "run", allow_abbrev=False,  # a script's `--step 5` is never taken for a flag's prefix
        help="launch a training job that survives faults (torchrun-compatible)",
        description="Launch TRAINING_SCRIPT on this node like torchrun, restarting it per the "
                    "HA policy. Flags after the script belong to the script.")
    t = p.add_argument_group("torchrun-compatible")
    _flag(t, "nnodes", type=str, help="nodes to train on (N; elastic MIN:MAX is not supported)")
    _flag(t, "nproc-per-node", type=str, help="workers per node: N, cpu, gpu or auto")
    _flag(t, "node-rank", type=int, help="this node's rank (0)")
    _flag(t, "master-addr", type=str, help="rank 0's address (127.0.0.1)")
    _flag(t, "master-port", type=int, help="first attempt's port (default: a free one)")
    _flag(t, "max-restarts", type=int, help="auto restart budget: 0 = off (default), 1-128")
    _flag(t, "monitor-interval", type=float, help="seconds between worker polls (0.1)")
    _flag(t, "run-id", type=str, help="job id (default: random); names the job dir")
    _flag(t, "rdzv-id", type=str, help="same as --run-id")
    _flag(t, "log-dir", type=str, help="where attempt logs go (default JOB_DIR/logs)")
    _flag(t, "redirects", "-r", type=str, help="streams kept off the console: 0-3 or lr:N,...")
    _flag(t, "tee", "-t", type=str, help="streams shown on the console despite --redirects "
          "(files always get them): 0-3 or lr:N,...")
    _flag(t, "local-ranks-filter", type=str, help="ranks shown on the console, e.g. 0,2")
    _flag(t, "rdzv-backend", type=str, help="static or c10d (others are not supported)")
    _flag(t, "rdzv-endpoint", type=str, help="host:port, used as master addr/port")
    _flag(t, "rdzv-conf", type=str, help="accepted and ignored (key=value,...)")
    t.add_argument("--standalone", action="store_true", default=S,
                   help="single-node job on localhost (the default)")
    t.add_argument("-m", "--module", action="store_true", default=S,
                   help="run the script as a Python module (python -m)")
    t.add_argument("--no-python", "--no_python", dest="no_python", action="store_true",
                   default=S, help="run the script as a program, not with python")
    h = p.add_argument_group("trainguard")
    h.add_argument("--config", type=Path, default=None, help="YAML job file")
    _flag(h, "scenario", choices=sorted(PRESETS), help="HA preset from the scenario table")
    _flag(h, "job-dir", type=str, help="job dir (default ./trainguard-runs/RUN_ID)")
    _flag(h, "checkpoint-dir", type=str, help="checkpoint dir (default JOB_DIR/checkpoints)")
    h.add_argument("--unconditional-restart", action="store_true", default=S,
                   help="restart on any non-zero exit (at most 3 in a row)")
    h.add_argument("--no-unconditional-restart", dest="unconditional_restart",
                   action="store_false", default=S, help="restart only what the diagnosis "
                   "says a restart can help (the default; turns a preset's or job file's off)")
    _flag(h, "restart-backoff", dest="restart_backoff_s", type=float,
          help="first restart delay in s, doubled each consecutive failure (1)")
    _flag(h, "restart-backoff-max", dest="restart_backoff_max_s", type=float,
          help="backoff cap in s (60)")
    _flag(h, "no-progress-limit", type=int,
          help="give up (exit 86: do not requeue) after N attempts without progress (3)")
    _flag(h, "grace-period", dest="grace_period_s", type=float,
          help="SIGTERM -> SIGKILL delay when stopping workers (15)")
    _flag(h, "step-pattern", type=str, help="regex with the step number as group 1")
    h.add_argument("--no-hang-detection", dest="hang_detection", action="store_false",
                   default=S, help="do not watch for hangs")
    _flag(h, "hang-timeout", dest="hang_timeout_s", type=float,
          help="confirm a hang after this many s without progress (default: learned from "
               "the job's step cadence)")
    _flag(h, "hang-floor", dest="hang_floor_s", type=float,
          help="the learned hang threshold is never below this (8 s)")
    _flag(h, "hang-startup-timeout", dest="hang_startup_s", type=float,
          help="allowance before the first step is seen (1800 s)")
    h.add_argument("--restart-on-hang", action="store_true", default=S,
                   help="on a confirmed hang, dump every rank's stack, stop and restart the "
                        "ranks in place (at most 3 in a row; not from the restart budget)")
    h.add_argument("--no-restart-on-hang", dest="restart_on_hang", action="store_false",
                   default=S, help="report a confirmed hang and leave the job running (the "
                   "default; turns a preset's or job file's off)")
    h.add_argument("--operator-reexecution", action="store_true", default=S,
                   help="re-execute a step that failed with a transient collective error in the "
                        "same processes (scripts that use trainguard.worker.step.StepGuard)")
    h.add_argument("--no-operator-reexecution", dest="operator_reexecution",
                   action="store_false", default=S, help="no step re-execution (the default; "
                   "turns a preset's or job file's off)")
    _flag(h, "step-retries", type=int,
          help="re-executions of one step before a process restart (1; at most 10)")
    _flag(h, "max-step-retries", type=int, help="step re-executions in the whole job (10)")
    _flag(h, "step-retry-timeout", dest="step_retry_timeout_s", type=float,
          help="how long a rank waits for the re-formed process group (60 s)")
    h.add_argument("--no-in-process-restart", dest="in_process_restart", action="store_false",
                   default=S, help="restart every rank as a process, even in scripts that "
                   "call trainguard.run_resilient (default: only the dead or hung rank starts "
                   "again; the others re-enter their training function in place)")
    _flag(h, "in-process-timeout", dest="in_process_timeout_s", type=float,
          help="how long a surviving rank waits for the launcher's in-process restart (60 s)")
    _flag(h, "prewarm-imports", type=_module_list,
          help="comma-separated modules the standby workers import ahead (besides torch, "
               "DDP and DCP, and what the job's workers were seen to import)")
    h.add_argument("--no-standby-workers", dest="standby_workers", action="store_false",
                   default=S, help="start restarted ranks cold (default: from pre-warmed "
                   "standby processes, one per rank of the node, that already imported torch)")
    _flag(h, "auto-resume", choices=["hf", "lightning"],
          help="make an unmodified Hugging Face Trainer or Lightning script resume from its "
               "newest committed checkpoint (a site hook wraps Trainer.train / Trainer.fit) "
               "and report its steps")
    _flag(h, "restart-args", type=shlex.split,
          help="arguments added after the script's own on every attempt but the job's first, "
               "e.g. --restart-args='--init_from=resume' (one string, split as a shell would)")
    _flag(h, "memory-every", type=int,
          help="steps between memory snapshots of scripts using trainguard.checkpoint: a "
               "rank restarted on the same node resumes from the node's shared memory "
               "(0: off, the default; 1: lose no step)")
    h.add_argument("--save-on-exit", action="store_true", default=S,
                   help="workers using trainguard.checkpoint save the last completed step "
                        "when they are stopped (within the grace period)")
    h.add_argument("--no-save-on-exit", dest="save_on_exit", action="store_false", default=S,
                   help="no save on the way out (the default; turns a preset's or job file's "
                        "off)")
    m = p.add_argument_group("multi-node (one controller; an agent per node)")
    _flag(m, "spare-nodes", type=int, help="standby nodes that replace a lost one (0)")
    _flag(m, "backend", choices=["local", "slurm"],
          help="local: virtual nodes on this machine (default); slurm: srun in an allocation "
               "(the current one, or one made with salloc)")
    _flag(m, "node-timeout", dest="node_timeout_s", type=float,
          help="a node agent silent this long is lost (10 s)")
    _flag(m, "reconnect-grace", dest="reconnect_grace_s", type=float,
          help="a node agent disconnected this long is lost (3 s)")
    _flag(m, "max-pod-reschedules", type=int,
          help="budget for replacing a lost node with a spare (3)")
    _flag(m, "max-job-reschedules", type=int,
          help="budget for isolating a faulty node and placing every rank again (3)")
    _flag(m, "repeat-offender", type=int,
          help="isolate a node implicated this many times within an hour (3; 0: never)")
    _flag(m, "queue-timeout", dest="queue_timeout_s", type=float,
          help="without enough healthy nodes, wait this long, then fail (300 s)")
    m.add_argument("--no-precheck", dest="precheck", action="store_false", default=S,
                   help="skip the per-node pre-check (disk, /dev/shm, accelerators, torch, ports)")
    _flag(m, "min-free-disk-mb", type=float, help="pre-check: free MiB in job/checkpoint dirs")
    _flag(m, "expect-accelerators", type=int, help="pre-check: accelerators per node (0)")
    _flag(m, "controller-host", type=str, help="address the controller listens on for agents")
    o = p.add_argument_group("monitoring")
    _flag(o, "metrics-port", type=int, help="serve Prometheus metrics live at "
          "http://127.0.0.1:PORT/metrics while the job runs (0: any free port; the URL is "
          "printed and kept as metrics_url in the job store)")
    _flag(o, "metrics-host", type=str, help="address the metrics endpoint binds (127.0.0.1; "
          "the metrics carry no secrets, but bind elsewhere only on a trusted network)")
    p.add_argument("--dry-run", action="store_true", help="print the effective settings "
                   "(preset < job file < flags, every default filled in) as JSON and exit "
                   "without starting anything")
    p.add_argument("training_script", nargs="?", default=S, help="script, module or program")
    p.add_argument("training_script_args", nargs=argparse.REMAINDER, default=S)
    p.set_defaults(func=_run_command)
    _RUN_FLAGS.update(o for o in p._option_string_actions if o.startswith("--"))


# the parsed names that are not the job's settings (spec_build.COMMAND_LINE_ONLY tells a job
# file that has one)
NOT_SPEC = ("func", "config", "command", "verbose", "dry_run")


def flags_to_spec_values(ns: argparse.Namespace) -> dict[str, Any]:
    """Turn parsed flags into JobSpec fields; errors name the flag and the fix."""
    v = {k: val for k, val in vars(ns).items() if k not in NOT_SPEC}
    out: dict[str, Any] = {}
    script_args = v.pop("training_script_args", None)
    if "training_script" in v:  # the script's arguments belong to the script on the command line
        out["entrypoint"] = v.pop("training_script")
        out["args"] = list(script_args or [])
    if "rdzv_id" in v:
        out["run_id"] = v.pop("rdzv_id")
    if "nnodes" in v:
        out["nnodes"] = _nnodes(v.pop("nnodes"))
    if "nproc_per_node" in v:
        out["nproc_per_node"] = nproc(v.pop("nproc_per_node"))
    if "redirects" in v:
        out["redirects"] = parse_std_map(v.pop("redirects"), "--redirects")
    if "tee" in v:  # as torchrun: what --tee names reaches the console, redirected or not
        teed = parse_std_map(v.pop("tee"), "--tee")
        kept = out.get("redirects", {})
        if kept:  # (files always get every stream; without --redirects so does the console)
            out["redirects"] = {k: kept.get(k, kept.get(-1, 0)) & ~teed.get(k, teed.get(-1, 0))
                                for k in {-1, *kept, *teed}}
    if "local_ranks_filter" in v:
        out["local_ranks_filter"] = _ranks(v.pop("local_ranks_filter"))
    _rdzv(v, out)
    for dropped in ("standalone", "rdzv_conf"):
        v.pop(dropped, None)
    out.update(v)
    return out


def _rdzv(v: dict[str, Any], out: dict[str, Any]) -> None:
    backend = v.pop("rdzv_backend", None)
    if backend is not None and backend not in _RDZV_OK:
        raise SpecError("--rdzv-backend", f"{backend!r} is not supported yet",
                        "drop it: trainguard runs its own rendezvous (a fresh store per attempt)")
    endpoint = v.pop("rdzv_endpoint", None)
    if endpoint:
        host, _, port = endpoint.rpartition(":")
        if not port.isdigit():
            raise SpecError("--rdzv-endpoint", f"{endpoint!r} has no port", "use HOST:PORT")
        out.setdefault("master_addr", host or "127.0.0.1")
        out.setdefault("master_port", int(port))


def _nnodes(s: str) -> int:
    m = re.fullmatch(r"(\d+)(?::(\d+))?", s.strip())
    if not m or (m.group(2) and m.group(1) != m.group(2)):
        raise SpecError("--nnodes", f"{s!r} is not supported",
                        "use a single number (elastic MIN:MAX ranges are not supported; "
                        "give spare nodes with --spare-nodes)")
    return int(m.group(1))


def nproc(s: str, name: str = "--nproc-per-node") -> int:
    s = s.strip().lower()
    if s.isdigit():
        return int(s)
    if s in ("cpu", "auto"):
        return _visible_gpus() or (os.cpu_count() or 1) if s == "auto" else os.cpu_count() or 1
    if s == "gpu":
        n = _visible_gpus()
        if not n:
            raise SpecError(name, "'gpu' but no GPU is visible", "give a number, or 'cpu'")
        return n
    raise SpecError(name, f"{s!r} is not a number", "use N, cpu, gpu or auto")


def _visible_gpus() -> int:
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return len([d for d in env.split(",") if d.strip()])
    return len(list(Path("/dev").glob("nvidia[0-9]*")))


def parse_std_map(s: str, flag: str) -> dict[int, int]:
    """torchrun's Std map: '3' for every local rank (key -1), or '0:1,1:2'."""
    s = s.strip()
    try:
        if s.isdigit():
            return {-1: _std(int(s), flag)}
        return {int(k): _std(int(val), flag)
                for k, val in (item.split(":") for item in s.split(","))}
    except ValueError:
        raise SpecError(flag, f"{s!r} is not a stream map",
                        "use 0 (none), 1 (stdout), 2 (stderr), 3 (both), or LR:N,LR:N") from None


def _std(n: int, flag: str) -> int:
    if not 0 <= n <= 3:
        raise ValueError(flag)
    return n


def _ranks(s: str) -> list[int]:
    try:
        return [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise SpecError("--local-ranks-filter", f"{s!r} is not a list of ranks",
                        "use comma-separated ranks, e.g. 0,2") from None


def job_file_values(data: dict[str, Any], path: Path, flags: dict[str, Any]) -> dict[str, Any]:
    """What a job file may spell as the flag does (`nproc_per_node: auto`, `nnodes: "2"`,
    `redirects: 3`, `local_ranks_filter: 0,2`), and an `entrypoint` relative to the job
    file's directory rather than the cwd (unless the command line names the script)."""
    out = dict(data)
    source = f"job file {path}"
    if isinstance(out.get("nproc_per_node"), str):
        out["nproc_per_node"] = nproc(out["nproc_per_node"], f"{source}: nproc_per_node")
    if isinstance(out.get("nnodes"), str):
        out["nnodes"] = _nnodes(out["nnodes"])
    if isinstance(out.get("redirects"), str | int) and not isinstance(out["redirects"], bool):
        out["redirects"] = parse_std_map(str(out["redirects"]), f"{source}: redirects")
    if isinstance(out.get("local_ranks_filter"), str | int):
        out["local_ranks_filter"] = _ranks(str(out["local_ranks_filter"]))
    entry = out.get("entrypoint")
    module = flags.get("module", out.get("module")) is True
    no_python = flags.get("no_python", out.get("no_python")) is True
    if (isinstance(entry, str) and "entrypoint" not in flags and not module
            and not Path(entry).is_absolute() and (not no_python or "/" in entry)):
        out["entrypoint"] = os.path.normpath(path.parent / entry)
    return out


def spec_from_args(ns: argparse.Namespace) -> Built:
    """The spec the flags and job file (`--config`) give, with each value's origin."""
    flags = flags_to_spec_values(ns)
    if ns.config is None:
        return build(None, flags)
    data = load_job_file(ns.config)
    if not data and "entrypoint" not in flags:
        raise SpecError("--config", f"{ns.config} is empty (no keys, so no entrypoint)",
                        "write the job's settings in it, at least `entrypoint: train.py`, or "
                        "give the training script after the flags")
    if not data:  # a template not filled in, or the wrong file: the job runs on the flags
        complain("run", f"job file {ns.config} is empty (no keys): nothing is taken from it; "
                 "the job runs on the flags and defaults. Fix: check the path, or leave "
                 "--config out", "note")
    job_file = job_file_values(data, ns.config, flags)
    return build(job_file, flags, f"job file {ns.config}")


def entrypoint_source(ns: argparse.Namespace) -> str:
    """What gave the script: the command line's argument or the job file's `entrypoint`."""
    if "training_script" in vars(ns) or ns.config is None:
        return "training_script"
    return f"job file {ns.config}: entrypoint"


_IGNORED = {
    "rdzv_conf": "--rdzv-conf is ignored: trainguard forms a fresh rendezvous per attempt",
}


def _run_command(ns: argparse.Namespace) -> int:
    from trainguard.launch import launch  # the launcher side loads only for `run`

    for key, note in _IGNORED.items():
        if key in vars(ns):
            complain("run", note, "note")
    spec, origin = spec_from_args(ns)
    # a script that is not there fails here, dry run or not
    argv = worker_argv(spec, entrypoint_source(ns))
    check_node_rank(spec, "node_rank" in origin)  # given, by a flag or the job file
    check_controller_host(spec)
    check_fault_env()
    if "training_script_args" in vars(ns):  # (a job file's `args:` are not after anything)
        note_flags_after_script(ns.training_script_args, _RUN_FLAGS)
    warn_shared_job_dir(spec)
    if getattr(ns, "dry_run", False):
        sys.stdout.write(json.dumps(dry_run_doc(spec, origin), indent=2) + "\n")
        return int(ExitCode.SUCCESS)
    return launch(spec, argv, marker=uuid.uuid4().hex)
