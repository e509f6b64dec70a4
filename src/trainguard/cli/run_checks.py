"""What `trainguard run` checks before anything starts, dry run or not: the script is there,
TRAINGUARD_FAULT parses, a multi-node job gets no node rank, and (a warning, a note) the job
dir is the job's own and none of the script's arguments is one of `run`'s flags."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from trainguard.cli.fmt import complain
from trainguard.errors import SpecError
from trainguard.paths import DB_NAME, JobPaths, foreign_entries
from trainguard.spec import JobSpec


def worker_argv(spec: JobSpec, source: str = "training_script") -> list[str]:
    if spec.no_python:
        return [spec.entrypoint, *spec.args]
    if spec.module:
        return [sys.executable, "-u", "-m", spec.entrypoint, *spec.args]
    if not Path(spec.entrypoint).is_file():
        where = "" if source == "training_script" else " (a relative entrypoint is read " \
            "from the job file's directory)"
        raise SpecError(source, f"{spec.entrypoint!r} is not a file{where}",
                        "check the path, or pass -m for a module / --no-python for a program")
    return [sys.executable, "-u", spec.entrypoint, *spec.args]


def check_fault_env() -> None:
    """A TRAINGUARD_FAULT the ranks could not parse is refused before any rank starts (each
    rank would die of a FaultSpecError, read as a bug in the script)."""
    from trainguard.testing.fault_spec import FaultSpecError, parse
    from trainguard.worker.contract import ENV_FAULT

    value = os.environ.get(ENV_FAULT, "")
    try:
        parse(value)
    except FaultSpecError as e:
        raise SpecError(ENV_FAULT, f"{value!r}: {e.problem}", e.fix or "write it as KIND[:ARG]@"
                        "step=S[,rank=R][,attempt=A|*] (docs/fault-injection.md), or unset "
                        "it") from None


def warn_shared_job_dir(spec: JobSpec) -> None:
    """A new job in a dir that already holds someone's files (`--job-dir .` in a project):
    say so before anything is written there."""
    job_dir = JobPaths.for_spec(spec, Path.cwd()).job_dir
    others = [] if (job_dir / DB_NAME).is_file() else foreign_entries(job_dir)
    if others:
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3
                                           else "")
        complain("run", f"--job-dir {job_dir} already holds files that are not a trainguard "
                 f"job's ({shown}): the job's store, logs and checkpoints go beside them "
                 "(`trainguard prune` deletes only those). Fix: give the job a dir of its "
                 "own, a new --job-dir", "warning")


# flags of `run` that training scripts commonly have of their own: no note for those
_SCRIPTS_TOO = frozenset({"--config", "--log-dir", "--checkpoint-dir", "--run-id", "--backend",
                          "--help", "--dry-run", "--module", "--redirects", "--tee"})


def note_flags_after_script(args: list[str], run_flags: set[str]) -> None:
    """`run train.py --nproc-per-node 2` gives the flag to the script, as torchrun does: say
    so, once, when a script argument is one of `run`'s own flags."""
    ours = [a for a in args if (name := a.split("=", 1)[0]) in run_flags
            and name.replace("_", "-") not in _SCRIPTS_TOO]
    if ours:
        complain("run", f"{', '.join(ours)} came after the training script, so the script gets "
                 f"{'it' if len(ours) == 1 else 'them'}, not trainguard (as with torchrun). Fix: "
                 "put trainguard's flags before the script", "note")


def check_node_rank(spec: JobSpec, given: bool) -> None:
    """`--node-rank 0` on a multi-node job: torchrun's per-node command typed on the first
    node (walk-through 19: both 'nodes' then ran on this machine, with no word). Other node
    ranks are refused by JobSpec itself."""
    if given and spec.multi_node and spec.node_rank == 0:
        local = (f"; with --backend local (the default) its {spec.nnodes} nodes are virtual "
                 "nodes on this machine (--backend slurm places them on a cluster's)"
                 if spec.backend == "local" else "")
        raise SpecError("--node-rank / 'node_rank'", "0 in a multi-node job: trainguard is not "
                        "started once per node as torchrun is", "drop it: run trainguard once, "
                        f"on one node; its controller starts an agent on every node{local}")


def check_controller_host(spec: JobSpec) -> None:
    """`--controller-host` must be an address of this machine: the controller listens there
    for the node agents (walk-through 36 #1: a typo or another host's name was a raw
    OSError or socket.gaierror traceback, after the job dir was made; --dry-run took it)."""
    host = spec.controller_host
    if not spec.multi_node or not host:
        return
    import socket

    fix = ("give an address of this machine (`hostname -I` lists them) or its name, or leave "
           "it out: the controller then listens on every interface (on loopback for the "
           "local backend's virtual nodes)")
    try:  # the controller listens on IPv4 (controller/hub.py)
        infos = socket.getaddrinfo(host, 0, socket.AF_INET, socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        try:
            socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError):
            raise SpecError("--controller-host / 'controller_host'",
                            f"{host!r} does not resolve ({e})", fix) from None
        raise SpecError("--controller-host / 'controller_host'",  # (review 40 #3)
                        f"{host!r} has no IPv4 address: the controller listens on IPv4 only",
                        fix) from None
    family, _, _, _, addr = infos[0]
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind(addr)
    except OSError as e:
        raise SpecError("--controller-host / 'controller_host'",
                        f"{host!r} ({addr[0]}) is not an address of this machine: the "
                        f"controller cannot listen there ({e.strerror or e})", fix) from None

