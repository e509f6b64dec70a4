"""A launch's claim on its --checkpoint-dir (launch_checks.prepare runs these): a checkpoint
dir that a running job of another job dir writes is refused, naming that job; an ended job's
is taken over; the owner mark (controller/dir_owner.py) says whose it is now. On an object
store the launch waits STORE_WAIT_S in all for its reads and write, and on S3 writes the mark
on a condition (two launches within one round trip). Also the checkpoint URL's filesystem."""

from __future__ import annotations

import functools
import time
from pathlib import Path

from trainguard.backends.orphans import AgentsSeen
from trainguard.checkpoint.store_errors import missing_bucket_problem
from trainguard.controller.dir_owner import (
    ABSENT,
    OWNER_NAME,
    bounded,
    default_owner,
    locked,
    lost_agents,
    missing_bucket_of,
    owner_version,
    read_owner,
    running,
    write_owner,
)
from trainguard.errors import SpecError
from trainguard.paths import JobPaths, is_url
from trainguard.spec import flag_name

STORE_WAIT_S = 10.0  # the most a launch waits for an object store's owner mark, in all


def store_deadline() -> float:
    """When a launch starting now stops waiting for an object store (monotonic)."""
    return time.monotonic() + STORE_WAIT_S


def check_checkpoint_dir(paths: JobPaths, store_until: float | None = None) -> None:
    """A checkpoint dir a running job of another job dir writes is refused (walk-through 31 #3:
    the second job's saves found their steps committed and wrote nothing, it ended `succeeded`,
    and a restart of it would have resumed the other's weights). An ended job's dir is taken
    over (continuing from its checkpoints); the same job continued keeps its own. An object
    store is asked until `store_until` (monotonic; default STORE_WAIT_S from now)."""
    mark = bounded(lambda: read_owner(paths.checkpoint_dir), _left(store_until))
    # both: a job dir's default dir keeps the mark of a job that took it over once, and then
    # ended, while its own job runs again (review of walk-through 31 #11)
    for owner in (mark, default_owner(paths.checkpoint_dir, paths.job_dir)):
        if owner and owner.get("job_dir") != str(paths.job_dir):
            _refuse_if_it_runs(paths, owner)


def _left(until: float | None) -> float:
    return STORE_WAIT_S if until is None else until - time.monotonic()


def _refuse_if_it_runs(paths: JobPaths, owner: dict[str, str]) -> None:
    """Refuse the checkpoint dir of `owner`'s job while that job runs, or its launcher is gone
    but its node agents' workers train on (review of walk-through 31 #13)."""
    if running(owner):
        agents = AgentsSeen()
    else:
        agents = lost_agents(owner)
        if not agents.may_run:
            return
    job = f"job {owner.get('run_id')!r} (job dir {owner.get('job_dir')})"
    fix = "give each job its own --checkpoint-dir, or wait for that job to end (or stop it) to " \
        "continue from its checkpoints"
    if agents.alive:
        job = (f"lost {job}: its launcher is gone, but the node agents of "
               f"{', '.join(agents.alive)} still run and their workers train on")
        fix = (f"`trainguard stop {owner.get('job_dir')}` ends them (or run that job's command "
               "again to take it over), or give each job its own --checkpoint-dir")
    elif agents.unknown:  # (their workers may train on: read as the recorded job)
        job = (f"lost {job}: its launcher is gone, and of its node agents {agents.unknown}, "
               "so their workers may train on")
        fix = ("run this again once Slurm answers (`trainguard status "
               f"{owner.get('job_dir')}` says which agents run), or give each job its own "
               "--checkpoint-dir")
    raise SpecError(f"{flag_name(paths.checkpoint_dir_key)} / '{paths.checkpoint_dir_key}'",
                    f"{paths.checkpoint_dir} is the checkpoint dir of the "
                    f"{'' if agents.may_run else 'running '}{job}: both jobs would save the "
                    "same steps, this job's saves would find them committed and write nothing, "
                    "and a restart of it would resume the other job's weights", fix)


def claim_checkpoint_dir(paths: JobPaths, run_id: str, store_until: float | None = None) -> None:
    """Write whose checkpoints a --checkpoint-dir holds (the owner mark; on an object store,
    until `store_until` at most, the check's time included, and not at all once it passed:
    the store did not answer, the ranks say it; review of walk-through 31 #7). The default
    JOB_DIR/checkpoints is not written, its job dir says whose it is, unless it holds the mark
    of another job that took it over once (that job ended: check_checkpoint_dir): it is the
    job's own again (review of walk-through 31 #11)."""
    if paths.checkpoint_dir_key != "checkpoint_dir":
        owner = read_owner(paths.checkpoint_dir)
        if owner is None or owner.get("job_dir") == str(paths.job_dir):
            return
    if is_url(paths.checkpoint_dir):  # no lock there
        until = store_until if store_until is not None else time.monotonic() + STORE_WAIT_S
        _claim_url(paths, run_id, until)
        check_checkpoint_dir(paths, until)  # again: a store that cannot write on a condition
        return
    with locked(paths.checkpoint_dir):  # two launches at once take turns (review #2)
        check_checkpoint_dir(paths)  # again: another launch may have claimed it since
        try:
            write_owner(paths.checkpoint_dir, run_id, paths.job_dir)
        except OSError as e:
            raise SpecError(f"{flag_name(paths.checkpoint_dir_key)} / "
                            f"'{paths.checkpoint_dir_key}'", f"cannot write "
                            f"{Path(paths.checkpoint_dir) / OWNER_NAME} ({e.strerror})",
                            "choose a writable directory") from None


CLAIM_TRIES = 3  # checks and conditional writes of one launch's mark on an object store


def _claim_url(paths: JobPaths, run_id: str, until: float) -> None:
    """Check an object store's mark and write this job's, on S3 on the condition that the mark
    is still the version read before the check (owner_version): a launch that wrote it in
    between (two launches within one round trip both started there: review of walk-through
    31 #3) makes the write fail, and the check runs again on what that launch wrote (a
    running job's mark: refused). Elsewhere (no conditional write), checked just before and
    after the write, as before."""
    url = paths.checkpoint_dir
    for _ in range(CLAIM_TRIES):
        # a version that could not be read (no answer, a 403) is taken as none there: the
        # write then fails if a mark is (review 34 #2)
        read = bounded(lambda: (owner_version(url),), _left(until))
        version = ABSENT if read is None else read[0]
        check_checkpoint_dir(paths, until)
        written = bounded(functools.partial(write_owner, url, run_id, paths.job_dir, version),
                          _left(until))
        if written is not False:  # written, or the store did not answer: the ranks say it
            return
    check_checkpoint_dir(paths, until)  # the last launch that wrote it may still run
    raise SpecError(f"{flag_name(paths.checkpoint_dir_key)} / '{paths.checkpoint_dir_key}'",
                    f"the owner mark of {url} changed under this launch {CLAIM_TRIES} times "
                    "(other launches write it at the same moment): this job's was not written",
                    "launch again once they have started, or give each job its own "
                    "--checkpoint-dir")


def check_checkpoint_url(paths: JobPaths, store_until: float | None = None) -> None:
    """A checkpoint URL's scheme must be one fsspec knows, with its package installed, and
    its bucket must not be one the store answers does not exist (the ranks would fail at
    their first save; walk-through 35 F2: three save intervals trained, nothing saved). The
    store is asked until `store_until` (default STORE_WAIT_S from now): no answer passes."""
    if not is_url(paths.checkpoint_dir):
        return
    _check_scheme(paths)
    url = paths.checkpoint_dir
    found = bounded(lambda: (missing_bucket_of(url),), _left(store_until))
    if found is not None and found[0] is not None:
        raise SpecError(f"{flag_name(paths.checkpoint_dir_key)} / '{paths.checkpoint_dir_key}'",
                        *missing_bucket_problem(url, found[0]))


def _check_scheme(paths: JobPaths) -> None:
    import fsspec  # only for a URL
    from fsspec.registry import known_implementations

    scheme = paths.checkpoint_dir.split("://", 1)[0]
    where = f"{flag_name(paths.checkpoint_dir_key)} / '{paths.checkpoint_dir_key}'"
    try:
        fsspec.get_filesystem_class(scheme)
    except ImportError as e:
        pkg = str(known_implementations.get(scheme, {}).get("class", "")).split(".")[0]
        if pkg in ("", "fsspec"):  # fsspec's own, needing another package (sftp: paramiko)
            problem, pkg = f"cannot be used ({e})", "the package named"
        else:
            problem = f"needs the package {pkg}, which is not installed"
        raise SpecError(where, f"{paths.checkpoint_dir}: the {scheme}:// filesystem {problem}",
                        f"pip install {pkg}, or use a local directory") from None
    except ValueError:
        known = [k for k in ("s3", "gs", "abfs", "hdfs", "memory") if k in known_implementations]
        raise SpecError(where, f"{paths.checkpoint_dir}: unknown URL scheme {scheme!r} (not "
                        "an fsspec filesystem)", f"use a scheme fsspec knows (e.g. "
                        f"{', '.join(known)}) or a local directory") from None
