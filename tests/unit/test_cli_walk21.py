"""Walk-through 21's findings about `trainguard run`'s flags (each failed before its fix)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from tests.unit.helpers import tg


def test_torchruns_c10d_command_with_another_machines_endpoint_is_refused(
        tmp_path: Path) -> None:
    """`--nnodes 2 --rdzv-backend c10d --rdzv-endpoint 10.0.0.1:29400` (torchrun's command,
    typed on each machine, with no --node-rank) ran here as two virtual nodes, the endpoint's
    host dropped, and `--dry-run` still showed it: on two machines, two independent jobs."""
    (tmp_path / "t.py").write_text("print('hi')\n")
    r = tg("run", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
           "--rdzv-endpoint", "10.0.0.1:29400", "--dry-run", "t.py", cwd=tmp_path)
    assert r.returncode == 2
    assert ("--rdzv-endpoint / --master-addr: '10.0.0.1' is another machine, in a multi-node "
            "job: trainguard is not started once per node as torchrun is") in r.stderr, r.stderr
    assert "Fix: drop it: run trainguard once" in r.stderr
    assert "its 2 nodes are virtual nodes on this machine" in r.stderr
    # this machine's own address (a tutorial's localhost) is harmless: virtual nodes here
    ok = tg("run", "--nnodes", "2", "--rdzv-endpoint", "localhost:29400", "--dry-run", "t.py",
            cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr


def test_a_single_node_jobs_unreachable_endpoint_names_the_flag_the_user_typed(
        tmp_path: Path) -> None:
    """The refusal named only `--master-addr`, a flag the user had not typed."""
    (tmp_path / "t.py").write_text("print('hi')\n")
    r = tg("run", "--rdzv-endpoint", "10.0.0.1:29400", "--dry-run", "t.py", cwd=tmp_path)
    assert r.returncode == 2
    assert "--master-addr / --rdzv-endpoint: cannot listen on '10.0.0.1'" in r.stderr, r.stderr


def test_the_slurm_backend_without_slurms_commands_is_refused_by_the_dry_run_too(
        tmp_path: Path) -> None:
    """`--backend slurm` with no srun on PATH passed `--dry-run` (rc 0); `run` refused it
    only at launch, after the job dir was made and recorded failed."""
    (tmp_path / "t.py").write_text("print('hi')\n")
    env = {**os.environ, "PATH": str(Path(sys.executable).parent)}  # no Slurm there
    assert shutil.which("srun", path=env["PATH"]) is None
    for extra in (["--dry-run"], []):
        r = tg("run", "--backend", "slurm", "--nnodes", "2", "--job-dir",
               str(tmp_path / "job"), *extra, "t.py", cwd=tmp_path, env=env)
        assert r.returncode == 2, (extra, r.stderr)
        assert ("--backend slurm: srun/scontrol are not on PATH. Fix: run on a Slurm login or "
                "compute node, or use --backend local") in r.stderr, r.stderr
        assert not (tmp_path / "job").exists()  # a refused launch leaves no dir


def test_this_machines_ipv6_address_is_its_own() -> None:
    """(review) the check bound AF_INET only: `::1` read as another machine."""
    from trainguard.launch_checks import bind_error

    assert bind_error("::1") is None and bind_error("[::1]") is None
    assert bind_error("127.0.0.1") is None and bind_error("192.0.2.1") is not None
