"""The goodput ledger and the live /metrics endpoint on real jobs with real faults."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import EXAMPLE, TG, run_tg
from trainguard.controller.store import JobStore
from trainguard.goodput import CAUSES, job_goodput

FAULTS = ("signal:KILL@rank=1,step=17,attempt=0;"
          "log:RuntimeError: NCCL error: unhandled system error@rank=0,step=35,attempt=1;"
          "exit:1@rank=0,step=35,attempt=1")


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """name + sorted labels -> value, through prometheus-client's own parser."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _scrape(job_dir: Path) -> str | None:
    try:
        with JobStore.open(job_dir) as store:
            url = store.meta().get("metrics_url")
    except Exception:
        return None
    if not url:
        return None
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return str(r.read().decode())
    except OSError:
        return None


def test_metrics_move_during_a_job_with_faults_and_the_parts_add_up(tmp_path: Path) -> None:
    job_dir = tmp_path / "job"
    env = {"TRAINGUARD_FAULT": FAULTS}

    proc = subprocess.Popen(
        [*TG, "run", "--nproc-per-node", "2", "--max-restarts", "3", "--metrics-port", "0",
         "--job-dir", str(job_dir), str(EXAMPLE), "--steps", "50", "--ckpt-every", "10",
         "--step-time", "0.05"],
        cwd=tmp_path, env={**os.environ, **env}, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True)
    scraped: list[dict[tuple[str, tuple[tuple[str, str], ...]], float]] = []
    deadline = time.monotonic() + 150
    while proc.poll() is None and time.monotonic() < deadline:
        text = _scrape(job_dir)
        if text:
            scraped.append(_samples(text))
        time.sleep(0.3)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]
    assert "[trainguard] metrics: http://127.0.0.1:" in err
    restarts = [s.get(("trainguard_restarts_total", (("rung", "process_restart"),)), 0)
                for s in scraped]
    steps = [s.get(("trainguard_step", ()), float("nan")) for s in scraped]
    assert len(scraped) >= 5, "the live endpoint answered too few scrapes"
    assert restarts[0] == 0 and max(restarts) == 2, restarts
    assert restarts == sorted(restarts), "a counter went down"
    seen = sorted({x for x in steps if x == x})
    assert len(seen) >= 2, f"the live step did not move: {seen}"

    with JobStore.open(job_dir) as store:
        g = job_goodput(store)
    parts = g.productive_s + sum(g.seconds(c) for c in CAUSES)
    assert abs(parts - g.wall_s) <= 0.01 * g.wall_s
    assert g.steps_wasted == (17 - 10) + (35 - 30)
    assert g.seconds("recovery") > 0 and g.seconds("startup") > 0
    assert g.seconds("wasted_progress") > 0
    ratio = g.ratio()
    assert ratio is not None and 0 < ratio < 1

    final = subprocess.run([*TG, "metrics", str(job_dir)], capture_output=True, text=True,
                           check=True, timeout=60).stdout
    m = _samples(final)
    assert m[("trainguard_job_state", (("state", "succeeded"),))] == 1
    # the live scrapes can miss the last steps (0.3 s apart, the job ends right after step 50)
    assert m[("trainguard_step", ())] == 50
    assert m[("trainguard_steps", (("fate", "wasted"),))] == 12
    assert m[("trainguard_recovery_duration_seconds_count", (("phase", "total"),))] == 2
    assert m[("trainguard_goodput_ratio", (("window", "all"),))] == ratio
    as_json = json.loads(subprocess.run([*TG, "metrics", str(job_dir), "--json"],
                                        capture_output=True, text=True, check=True,
                                        timeout=60).stdout)  # the same samples, as JSON
    j = {(x["name"], tuple(sorted(x["labels"].items()))): x["value"]
         for f in as_json for x in f["samples"]}
    assert j.keys() == m.keys()  # (the windowed figures move with the clock: not compared)
    assert j[("trainguard_step", ())] == 50
    assert j[("trainguard_steps", (("fate", "wasted"),))] == 12
    report = json.loads(subprocess.run([*TG, "report", str(job_dir), "--json"],
                                       capture_output=True, text=True, check=True,
                                       timeout=60).stdout)
    assert len(report["incidents"]) == 2
    assert report["checkpoint_interval"]["mtbf_s"] > 0


SCRIPT = """
import os, signal, sys, time
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
for epoch in range(6):
    print(f"epoch {epoch} loss 0.5", flush=True)
    time.sleep(0.4)
    if restart == 0 and epoch == 2 and os.environ["RANK"] == "0":
        os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_script_without_step_reports_still_shows_its_restart_as_lost_time(
        tmp_path: Path) -> None:
    script = tmp_path / "epochs.py"
    script.write_text(SCRIPT)
    job_dir = tmp_path / "job"
    r = run_tg(["run", "--nproc-per-node", "1", "--max-restarts", "1", "--job-dir",
                str(job_dir), str(script)], cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    with JobStore.open(job_dir) as store:
        g = job_goodput(store)
    assert not g.measured_steps
    assert g.seconds("recovery") > 0.2  # fault -> the restarted script's first line
    ratio = g.ratio()
    assert ratio is not None and ratio < 0.95
