"""The multi-node tests' real Slurm cluster: installed if need be, started once per session."""

from __future__ import annotations

import contextlib
import fcntl
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.integration.conftest import clean_digest  # noqa: F401 (a fixture: the weights to match)
from tests.multinode.slurm_cluster import ClusterError, SlurmCluster, ensure_installed

# slurmstepd listens on <spool>/<node>/<node>_<job>.<step>: a unix socket path (< 108 bytes)
MAX_BASE_LEN = 60
# two pytest-xdist workers may each start a cluster: one apt-get and one munged start at a time
SETUP_LOCK = Path(tempfile.gettempdir()) / "trainguard-tests-slurm-setup.lock"


@contextlib.contextmanager
def _setup_lock() -> Iterator[None]:
    with SETUP_LOCK.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A started cluster n1..n3 (2 CPUs each); fails the tests (never skips) if it cannot."""
    with _setup_lock():
        try:
            ensure_installed()
        except ClusterError as e:
            pytest.fail(f"cannot install Slurm for the multi-node tests: {e}", pytrace=False)
        base = tmp_path_factory.mktemp("slurm")
        if len(str(base)) > MAX_BASE_LEN:
            base = Path(tempfile.mkdtemp(prefix="tg-slurm-", dir="/tmp"))
        cluster = SlurmCluster(base)
        try:
            cluster.start()
        except (ClusterError, OSError) as e:
            cluster.stop()
            pytest.fail(f"cannot start the Slurm test cluster in {base}: {e}", pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop()


def _slurmd_running(cluster: SlurmCluster, node: str) -> bool:
    """Whether this cluster's slurmd for node runs (found by its -f <conf> -N <node>)."""
    for p in psutil.process_iter(["cmdline", "status"]):
        cmd = p.info["cmdline"] or []
        if (cmd and cmd[0].endswith("slurmd") and str(cluster.conf) in cmd
                and node in cmd and p.info["status"] != psutil.STATUS_ZOMBIE):
            return True
    return False


def _squeue_ids(cluster: SlurmCluster) -> list[str]:
    r = subprocess.run(["squeue", "-h", "-o", "%i"], env=cluster.env(), capture_output=True,
                       text=True, timeout=20, check=False)
    return r.stdout.split()


@pytest.fixture
def clean_cluster(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The session's cluster, left clean after each test whatever it did: killed slurmd's
    started again, every job cancelled (and gone from squeue), drained or down nodes
    resumed, every node idle."""
    yield slurm_cluster
    cluster = slurm_cluster
    for node in cluster.nodes:
        if not _slurmd_running(cluster, node):
            cluster.restart_node(node)
    subprocess.run(["scancel", "--user", "root"], env=cluster.env(), capture_output=True,
                   timeout=20, check=False)
    deadline = time.monotonic() + 45
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        states = cluster.node_states()
        for node in cluster.nodes:
            if states.get(node, "").startswith(("drain", "down")):
                cluster.resume(node)
        if not _squeue_ids(cluster) and all(states.get(n) == "idle" for n in cluster.nodes):
            return
        time.sleep(0.5)
    pytest.fail(f"the Slurm cluster did not come back clean within 45 s: {states}, jobs "
                f"{_squeue_ids(cluster)}\n{cluster.sinfo_text()}\n{cluster.daemon_logs()}",
                pytrace=False)
