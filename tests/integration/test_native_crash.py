"""A rank that crashes in native code leaves its Python stack in its log (walk-through 20,
nit 11): the agent sets PYTHONFAULTHANDLER=1 unless the user set it, so a segfault shows
which line of the script was running, and the diagnosis still reads it as a native crash."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.conftest import read_json, run_tg

pytestmark = pytest.mark.integration

SCRIPT = """
import ctypes
def collate(batch):
    return ctypes.string_at(0)  # reads address 0: SIGSEGV in native code
print("step 1", flush=True)
collate([1])
"""


def test_a_segfault_leaves_the_scripts_python_stack_in_the_rank_log(tmp_path: Path) -> None:
    script = tmp_path / "seg.py"
    script.write_text(SCRIPT)
    job = tmp_path / "job"
    r = run_tg(["run", "--nproc-per-node", "1", "--max-restarts", "0", "--job-dir", str(job),
                str(script)], cwd=tmp_path)
    assert r.returncode == 1, r.stderr[-3000:]
    log = (job / "logs" / "attempt-0" / "rank-0.log").read_text()
    assert "Fatal Python error: Segmentation fault" in log
    assert f'File "{script}", line 4 in collate' in log, log[-2000:]
    d = read_json("diagnose", job)["diagnosis"]
    assert d["category"] == "segfault_or_abort", d
