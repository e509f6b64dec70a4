"""The multi-node tests' real Slurm cluster: installed if need be, started once per session."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.multinode.slurm_cluster import ClusterError, SlurmCluster, ensure_installed

# slurmstepd listens on <spool>/<node>/<node>_<job>.<step>: a unix socket path (< 108 bytes)
MAX_BASE_LEN = 60


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A started cluster n1..n3 (2 CPUs each); fails the tests (never skips) if it cannot."""
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
