"""Small things the second new-user walk-through found, each through the real command
(`python -m trainguard`, a real job store and files)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.unit.helpers import a_job, tg


def test_logs_of_a_rank_the_job_does_not_have_names_the_ranks_it_has(tmp_path: Path) -> None:
    job = a_job(tmp_path / "j", 2)
    r = tg("logs", str(job), "--rank", "5")
    assert r.returncode == 2
    assert "the job has no rank 5: its ranks are 0, 1" in r.stderr
    assert "hello from 1" in tg("logs", str(job), "--rank", "1").stdout


def test_dry_run_shows_the_job_dir_says_when_the_run_id_comes_and_checks_the_script(
        tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    first, again = (json.loads(tg("run", "--dry-run", "train.py", cwd=tmp_path).stdout)
                    for _ in range(2))
    assert first == again  # nothing random
    assert first["run_id"] is None and "assigned at launch" in first["run_id_note"]
    assert first["job_dir"] == str(tmp_path / "trainguard-runs" / "<run id>")
    held = a_job(tmp_path / "held", 1)  # a relaunch of a job dir continues its run id
    doc = json.loads(tg("run", "--dry-run", "--job-dir", str(held), "train.py",
                        cwd=tmp_path).stdout)
    assert (doc["run_id"], doc["job_dir"]) == ("run-w", str(held))
    missing = tg("run", "--dry-run", "nosuch.py", cwd=tmp_path)
    assert missing.returncode == 2 and "'nosuch.py' is not a file" in missing.stderr


def test_ls_without_root_lists_the_jobs_run_puts_in_its_default_job_dir(tmp_path: Path) -> None:
    from trainguard.paths import JobPaths
    from trainguard.spec import JobSpec

    default = JobPaths.for_spec(JobSpec(entrypoint="t.py", run_id="tg-1"), tmp_path).job_dir
    a_job(default, 1)
    r = tg("ls", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert [row["job_dir"] for row in json.loads(r.stdout)] == [str(default)]
    help_text = " ".join(tg("ls", "--help").stdout.split())
    assert "where `trainguard run` puts a job given no" in help_text
    none = tg("ls", cwd=tmp_path / "trainguard-runs" / "tg-1" / "logs")
    assert none.returncode == 2 and "(the default: where `trainguard run` puts" in none.stderr


def test_ui_without_arguments_names_the_fix_when_there_is_no_default_job_dir(
        tmp_path: Path) -> None:
    r = tg("ui", cwd=tmp_path)
    assert r.returncode == 2
    assert "Fix: trainguard ui JOB_DIR, or trainguard ui --root DIR" in r.stderr


def test_the_preset_table_in_the_docs_has_every_setting_a_preset_sets() -> None:
    from trainguard.spec import PRESETS

    text = (Path(__file__).resolve().parents[2] / "docs" / "scenarios.md").read_text()
    rows = {line.split("`")[1]: [c.strip() for c in line.split("|")[2:-1]]
            for line in text.splitlines() if line.startswith("| `")}
    for name, preset in PRESETS.items():
        for key, value in preset.items():
            shown = rows[key][1 + list(PRESETS).index(name)].split()[0]
            want = (("on" if value else "off") if isinstance(value, bool) else
                    f"{value:g}" if isinstance(value, float) else str(value))
            assert shown == want, (name, key)


def test_every_fault_spec_shown_in_the_docs_parses_and_the_field_order_is_as_documented(
) -> None:
    import re

    from trainguard.testing.faults import parse

    root = Path(__file__).resolve().parents[2]
    specs = [m for doc in [root / "README.md", *sorted((root / "docs").glob("*.md"))]
             for m in re.findall(r"TRAINGUARD_FAULT='([^']+)'", doc.read_text())
             if not m.startswith("KIND")]  # the format itself
    page = (root / "docs" / "fault-injection.md").read_text()
    assert len(re.findall(r"TRAINGUARD_FAULT='([^']+)'", page)) >= 9
    for spec in specs:
        assert parse(spec), spec
    (f,) = parse("exit:3@step=5,rank=0")
    assert (f.kind, f.arg, f.step, f.rank, f.attempt) == ("exit", "3", 5, 0, 0)
    (f,) = parse(r"log:mail me\@example.org\; later@step=3")
    assert (f.arg, f.rank, f.attempt) == ("mail me@example.org; later", None, 0)
    assert parse("slow:2.5@step=20,attempt=*")[0].attempt is None


def test_progress_is_what_restart_policy_md_defines_new_steps_or_new_checkpoints() -> None:
    """docs/restart-policy.md#progress, item by item, against controller.high_water."""
    from trainguard.controller.high_water import HighWater
    from trainguard.protocol import NodeReport, Progress
    from trainguard.records import utcnow

    def report(step: int | None) -> NodeReport:
        return NodeReport(node="n", attempt=0, workers=[], progress=Progress(last_step=step),
                          at=utcnow())

    marks = HighWater(max_step=20)  # a step reached by an earlier launch
    assert not marks.made_progress(report(20), None, None)  # the same step again: no
    assert not marks.made_progress(report(22), None, None)  # within the jitter (2 steps): no
    assert marks.made_progress(report(23), None, None)  # (1) a new step beyond it
    # 1% of the steps the attempt ran: 1,000 from step 1
    ran = NodeReport(node="n", attempt=0, workers=[], at=utcnow(),
                     progress=Progress(first_step=1, last_step=1011))
    assert HighWater(max_step=1000).made_progress(ran, None, None)
    assert not HighWater(max_step=1001).made_progress(ran, None, None)
    # not of the job's step count (review): resumed at 100,000, 720 steps on is new ground
    resumed = NodeReport(node="n", attempt=0, workers=[], at=utcnow(),
                         progress=Progress(first_step=100_001, last_step=100_720))
    assert HighWater(max_step=100_000).made_progress(resumed, None, None)
    assert marks.made_progress(report(None), 10, None)  # (2) a checkpoint, no step lines
    marks.note(report(None), 10)
    assert not marks.made_progress(report(None), 10, None)  # the same checkpoint: no
    assert "restart-policy.md#progress" in (Path(__file__).resolve().parents[2] / "docs" /
                                             "checkpoints.md").read_text()


def test_a_failure_that_lands_a_step_or_two_apart_does_not_escape_the_no_progress_guard(
        ) -> None:
    """Walk-through 20, nit 12: attempts failing at one place, ending at steps 100, 101, 102,
    103 (rank skew, a failure at a fixed time) each set a new high-water mark; each counted
    as progress, so the guard never gave up. Now the creep is no progress, and the mark still
    says how far any attempt got."""
    from trainguard.controller.high_water import HighWater
    from trainguard.protocol import NodeReport, Progress
    from trainguard.records import utcnow

    marks = HighWater()
    seen = []
    for step in (100, 101, 102, 103, 104):
        r = NodeReport(node="n", attempt=0, workers=[], progress=Progress(last_step=step),
                       at=utcnow())
        seen.append(marks.made_progress(r, None, None))
        marks.note(r, None)
    assert seen == [True, False, False, False, False]
    assert marks.max_step == 104 and "beyond step 104" in marks.stuck()
