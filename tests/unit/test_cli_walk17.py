"""Nits the seventeenth new-user walk-through met, with the real command."""

from __future__ import annotations

import json
from pathlib import Path

from tests.unit.helpers import tg


def test_status_says_a_budget_is_off_when_the_job_does_not_use_its_rung(
        tmp_path: Path) -> None:
    """`hang_restarts_in_a_row 0/3` read as if a confirmed hang would be restarted, though
    --restart-on-hang was off; the launcher records which rungs the job's flags leave out."""
    (tmp_path / "t.py").write_text("print('step 1', flush=True)\n")
    r = tg("run", "--nproc-per-node", "1", "--job-dir", "j", "--operator-reexecution", "t.py",
           cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(tg("status", "j", "--json", cwd=tmp_path).stdout)
    assert doc["budgets_off"] == ["hang_restarts_in_a_row"]
    out = tg("status", "j", cwd=tmp_path).stdout
    assert "hang_restarts_in_a_row off  step_retries 0/10" in out, out
    r = tg("run", "--nproc-per-node", "1", "--job-dir", "j", "--restart-on-hang", "t.py",
           cwd=tmp_path)  # a relaunch with other flags: what this launch uses
    assert r.returncode == 0, r.stderr
    doc = json.loads(tg("status", "j", "--json", cwd=tmp_path).stdout)
    assert doc["budgets_off"] == ["step_retries"]
