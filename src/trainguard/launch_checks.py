"""What `run` and `run --dry-run` both check before anything starts (prepare), with the
same words: the job, log and checkpoint dirs, the checkpoint URL's filesystem, the job dir's
owner, lock and run id, a --log-dir's owner, the rendezvous address and the metrics port. A launch
refused here leaves no job record behind."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from trainguard.controller.dir_owner import OWNER_NAME, read_owner, write_owner
from trainguard.controller.store import JobStore, db_path, other_job
from trainguard.controller.store_rows import log_dir_of
from trainguard.errors import SpecError, StoreError
from trainguard.launch_ckpt_dir import (
    check_checkpoint_dir,
    check_checkpoint_url,
    claim_checkpoint_dir,
    store_deadline,
)
from trainguard.paths import LOCK_NAME, JobPaths, attempt_logs, is_url
from trainguard.spec import JobSpec, flag_name


def prepare(spec: JobSpec, create: bool) -> tuple[JobSpec, JobPaths]:
    """What `run` and `run --dry-run` both check before anything starts, in this order: the
    checkpoint URL's filesystem, that the job, log and checkpoint dirs are the user's own
    (check_dirs_owner; again once they are made), that
    no launcher holds the job dir (`run` then takes its
    lock, job_lock, with the same words: a job still running is said to be, not its metrics
    port), that the run id fits the job dir (continued_run), that a --log-dir holds no other
    job's logs (check_log_dir; `run` then writes whose it is), that no other running job
    writes the checkpoint dir (check_checkpoint_dir; `run` then claims it), the rendezvous
    address (a single-node job's, or a local multi-node job's), Slurm's commands for
    `--backend slurm` (and a partition as large as the job) and the metrics endpoint; then
    the job, log and checkpoint dirs can be made (and are, unless `create` is False).
    Errors name the flag and the fix."""
    paths = JobPaths.for_spec(spec, Path.cwd())
    store_until = store_deadline()  # an object store's reads and write, in all
    check_checkpoint_url(paths, store_until)
    check_dirs_owner(paths)
    check_unlocked(paths.job_dir)
    spec = continued_run(spec, paths.job_dir)
    check_log_dir(paths)
    check_checkpoint_dir(paths, store_until)
    if not spec.multi_node:  # a multi-node job meets at its first node's address
        check_master_addr(spec.master_addr)
    elif spec.backend == "local":  # ... on this machine: another machine's is a mistake
        check_local_nodes_addr(spec)
    check_backend(spec)
    check_metrics_port(spec)
    paths.make(create)
    if create:
        check_dirs_owner(paths)  # again: one another user made meanwhile is theirs
        claim_log_dir(paths, spec.run_id)
        claim_checkpoint_dir(paths, spec.run_id, store_until)
    return spec, paths


def check_dirs_owner(paths: JobPaths) -> None:
    """The job dir, a --log-dir and a local --checkpoint-dir another user owns, or that every
    user may write, are refused: they could replace what the job reads back (a multi-node
    job's controller address, which its agents follow; the store; the logs `diagnose` reads;
    the checkpoints it resumes from) (walk-through 32 #8; its review #10: the checkpoint dir
    was taken as it was). `prepare` checks before anything is made and again after the dirs
    are made: a dir another user made in between is refused too (its review #3)."""
    dirs = [("job_dir", paths.job_dir), (paths.log_dir_key, paths.log_dir)]
    if not is_url(paths.checkpoint_dir):
        dirs.append((paths.checkpoint_dir_key, Path(paths.checkpoint_dir)))
    for key, d in dirs:
        _check_dir_owner(flag_name(key), d)


def _check_dir_owner(flag: str, d: Path) -> None:
    try:
        st = d.stat()
    except OSError:
        return  # made by this launch (or unusable: paths.make says why)
    if st.st_uid != os.geteuid():
        raise SpecError(flag, f"{d} belongs to uid {st.st_uid}, not to you (uid "
                        f"{os.geteuid()}): its owner could point the job's agents at a "
                        "controller of theirs or replace its checkpoints",
                        f"use a {flag.lstrip('-').replace('-', ' ')} of your own")
    if _read_only(d):  # said first: no chmod fixes a read-only mount (walk-through 40 #9)
        raise SpecError(flag, f"{d} is on a read-only file system: the job cannot write there",
                        f"use another {flag} on a writable disk, or remount it read-write")
    if st.st_mode & 0o002:
        raise SpecError(flag, f"{d} may be written by every user (mode "
                        f"{st.st_mode & 0o7777:o}): anyone could replace what the job reads "
                        "back", f"chmod o-w {d}, or use another {flag}")


def _read_only(d: Path) -> bool:
    try:
        return bool(os.statvfs(d).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def check_log_dir(paths: JobPaths) -> None:
    """A --log-dir that holds another job's `attempt-N` logs is refused: the two jobs' ranks
    would append to the same `attempt-N/rank-R.log` files, and `logs` and `diagnose` of either
    would read the other's lines (walk-through 28: torchrun makes a folder per run, so a team
    passes one fixed --log-dir). The job continued in the same job dir (a requeue) keeps it;
    so does a log dir written before the owner file was (the job dir's store names it)."""
    if paths.log_dir_key != "log_dir":
        return  # JOB_DIR/logs: the job dir's own
    held = attempt_logs(paths.log_dir)
    if not held:
        return
    owner = read_owner(paths.log_dir)
    if owner is not None and owner.get("job_dir") == str(paths.job_dir):
        return
    if owner is None and _stored_log_dir(paths.job_dir) == paths.log_dir:
        return
    who = (f"the job {owner.get('run_id')!r} (job dir {owner.get('job_dir')})"
           if owner is not None else "an earlier job")
    shown = ", ".join(held[:3]) + (", ..." if len(held) > 3 else "")
    raise SpecError("--log-dir / 'log_dir'", f"{paths.log_dir} holds the logs of {who} "
                    f"({shown}): this job's ranks would write into the same "
                    "attempt-N/rank-R.log files, and `logs` and `diagnose` of either job "
                    "would read the other's lines", "give each job its own --log-dir (e.g. "
                    "--log-dir logs/<run name>; torchrun makes a folder per run), or leave "
                    "--log-dir out (the logs go to JOB_DIR/logs)")


def claim_log_dir(paths: JobPaths, run_id: str) -> None:
    """Write whose logs a --log-dir holds (the owner mark), for check_log_dir."""
    if paths.log_dir_key != "log_dir":
        return
    try:
        write_owner(paths.log_dir, run_id, paths.job_dir)
    except OSError as e:
        raise SpecError("--log-dir / 'log_dir'", f"cannot write {paths.log_dir / OWNER_NAME} "
                        f"({e.strerror})", "choose a writable directory") from None


def _stored_log_dir(job_dir: Path) -> Path | None:
    """The log dir of the job the job dir holds, if it holds one."""
    if not db_path(job_dir).is_file():
        return None
    try:
        with JobStore.open(job_dir) as store:
            return log_dir_of(store.meta(), job_dir).resolve()
    except (StoreError, OSError):
        return None


def continued_run(spec: JobSpec, job_dir: Path) -> JobSpec:
    """Launching a job dir that holds a job again, with no --run-id, continues that job (a
    retry, `sbatch --requeue`): it takes the stored run id. An explicit, different --run-id is
    refused (StoreError, the store's own words)."""
    if not db_path(job_dir).is_file():
        return spec
    try:
        with JobStore.open(job_dir) as store:
            stored = store.meta().get("run_id")
    except StoreError:
        return spec  # being created, or unreadable: JobStore.create says why
    if not isinstance(stored, str):
        return spec
    if "run_id" not in spec.model_fields_set:
        return spec.model_copy(update={"run_id": stored})
    if spec.run_id != stored:
        raise other_job(job_dir, stored, spec.run_id)
    return spec


@contextlib.contextmanager
def job_lock(job_dir: Path) -> Iterator[None]:
    """One launcher per job dir: a second one is refused, naming the one that runs."""
    path = job_dir / LOCK_NAME
    with open(path, "a+", encoding="utf-8") as f:
        _lock_or_refuse(f, job_dir)
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def check_unlocked(job_dir: Path) -> None:
    """Refuse, as job_lock would, a job dir in use by a running launcher (the lock is taken
    and let go at once; a missing lock file is not made)."""
    try:
        f = open(job_dir / LOCK_NAME, encoding="utf-8")  # noqa: SIM115 (closed below)
    except OSError:
        return  # no launcher ever ran there (or job_lock says why at launch)
    with f:
        _lock_or_refuse(f, job_dir)
        fcntl.flock(f, fcntl.LOCK_UN)


def _lock_or_refuse(f: IO[str], job_dir: Path) -> None:
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        raise SpecError("--job-dir", f"{job_dir} is in use by a running launcher "
                        f"(pid {holder})", "wait for it to end, stop it (`trainguard "
                        f"stop {job_dir}`), or use another --job-dir") from None


def check_backend(spec: JobSpec) -> None:
    """`--backend slurm` needs Slurm's client commands here (the backend refused it only at
    launch, after the job dir was made and recorded failed, and `--dry-run` passed it), and
    outside an allocation, a partition with the nodes the job asks for."""
    from trainguard.backends import slurm_cli

    if spec.backend != "slurm":
        return
    if not slurm_cli.available():
        raise SpecError("--backend slurm", "srun/scontrol are not on PATH", "run on a Slurm "
                        "login or compute node, or use --backend local")
    if slurm_cli.parse_allocation(os.environ) is not None:
        return  # its own nodes: the backend compares their count
    try:
        default, sizes = slurm_cli.partitions(timeout_s=PARTITIONS_TIMEOUT_S)
    except slurm_cli.SlurmError as e:  # no cluster at all: said now, by --dry-run too (salloc
        if slurm_cli.no_cluster(e.stderr):  # tried for 70 s, walk-through 42 #3)
            raise SpecError("--backend slurm", f"`sinfo` finds no Slurm cluster here: "
                            f"{e.stderr.splitlines()[-1] if e.stderr else e.problem}",
                            slurm_cli.NO_CLUSTER_FIX) from None
        return  # salloc then says what is wrong with the cluster, with its fix
    error = partition_too_small(spec, slurm_cli.salloc_partition(os.environ, default, sizes))
    if error is not None:
        raise error


PARTITIONS_TIMEOUT_S = 10.0


def partition_too_small(spec: JobSpec, partition: tuple[str, int] | None) -> SpecError | None:
    """The error for a job that asks the partition `salloc` uses for more nodes than it has
    (no wait or resume gives them; salloc queued the whole --queue-timeout and said to wait
    longer: walk-through 36 #7); None when it fits or the partition is unknown."""
    asked = spec.nnodes + spec.spare_nodes
    if partition is None or asked <= partition[1]:
        return None
    name, size = partition
    return SpecError("--nnodes / --spare-nodes", f"the job asks Slurm for {asked} nodes "
                     f"(--nnodes {spec.nnodes} + --spare-nodes {spec.spare_nodes}) and the "
                     f"partition {name} has {size}: no wait gives more",
                     f"ask for at most {size} nodes in all (lower --spare-nodes or --nnodes), "
                     "or name a larger partition (SALLOC_PARTITION=NAME)")


def check_master_addr(addr: str) -> None:
    """The rendezvous address must be one this node can listen on."""
    e = bind_error(addr)
    if e is not None:
        raise SpecError("--master-addr / --rdzv-endpoint", f"cannot listen on {addr!r} on "
                        f"this node ({e.strerror or e})", "use 127.0.0.1 or one of this "
                        "node's addresses")


def check_local_nodes_addr(spec: JobSpec) -> None:
    """`--rdzv-endpoint HOST:PORT` (or `--master-addr`) naming another machine in a
    multi-node job on the local backend: torchrun's c10d command, typed on each machine, ran
    there as a whole job of virtual nodes (walk-through 21). An address of this machine (the
    default, a tutorial's `localhost`) is harmless; on Slurm, from a login node, the address
    is a fallback (walk-through 19)."""
    if bind_error(spec.master_addr) is None:
        return
    raise SpecError("--rdzv-endpoint / --master-addr", f"{spec.master_addr!r} is another "
                    "machine, in a multi-node job: trainguard is not started once per node as "
                    "torchrun is, and its nodes meet at the node that holds rank 0",
                    "drop it: run trainguard once, on one node; its controller starts an "
                    f"agent on every node; with --backend local (the default) its "
                    f"{spec.nnodes} nodes are virtual nodes on this machine (--backend slurm "
                    "places them on a cluster's)")


def bind_error(addr: str) -> OSError | None:
    """Why this machine cannot listen on `addr` (not one of its own), or None; a name or an
    IPv6 address too (`::1`: a bracketed endpoint's host)."""
    try:
        family, kind, proto, _, sockaddr = socket.getaddrinfo(
            addr.strip("[]"), 0, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as s:
            s.bind(sockaddr)
    except OSError as e:
        return e
    return None


def check_metrics_port(spec: JobSpec) -> None:
    """`--metrics-host`:`--metrics-port` must be bindable as the server will bind it (a
    failure at launch would fail the job before it starts); port 0 is any free one."""
    if spec.metrics_port is None:
        return
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(
            spec.metrics_host, spec.metrics_port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
            s.bind(addr[:2])  # as the server binds: (host, port), an IPv6 scope id dropped
    except OSError as e:
        raise metrics_port_refused(spec, e) from None


def metrics_port_refused(spec: JobSpec, e: OSError) -> SpecError:
    """A port in use or not allowed is the port's fault; anything else (a name that does not
    resolve, an address not on this node) the host's."""
    where = f"cannot serve metrics on {spec.metrics_host}:{spec.metrics_port} ({e.strerror or e})"
    if e.errno in (errno.EADDRINUSE, errno.EACCES):
        return SpecError("--metrics-port", where, "pick a free port, or 0 for any")
    return SpecError("--metrics-host", where, "use 127.0.0.1 or one of this node's addresses")
