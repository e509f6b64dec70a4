"""`trainguard ui` in a real browser (Debian's chromium through Playwright) over real jobs:

- `recovering`: rank 1 waits on a file lock this module holds at step 5, then is killed by
  SIGKILL at step 6; the job restarts and finishes. The page is opened while attempt 0 is
  held, the lock is let go, and the new attempt's bar and the failure's events must appear
  without a reload.
- `hangfail`: rank 1 hangs after step 8 (confirmed, stacks dumped, restarted in place), then
  raises at step 12 of the next attempt: a user-code error, so the job fails, diagnosed.

Both jobs run at once from the module's start; the tests share them.
"""

from __future__ import annotations

import fcntl
import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest
from playwright.sync_api import Page, Route, expect

from tests.browser.conftest import Job, UiServer, screenshot, wait_for
from trainguard.ui.catalog import job_id

pytestmark = [pytest.mark.integration,
              pytest.mark.serial]  # UI latencies and a browser beside a second job: alone

@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ui-root")


class Gate:
    """A file lock held until `release()`: rank 1 of `recovering` waits on it at step 5."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = open(path, "a")  # noqa: SIM115
        fcntl.flock(self._file, fcntl.LOCK_EX)

    def release(self) -> None:
        if not self._file.closed:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()


@pytest.fixture(scope="module")
def gate(root: Path) -> Iterator[Gate]:
    g = Gate(root / "gate.lock")
    yield g
    g.release()


# the recovering job's flags and script arguments (its relaunch runs the same command)
RECOVERING = (["--max-restarts", "2", "--hang-timeout", "300"],
              ["--steps", "12", "--ckpt-every", "5", "--step-time", "0.05"])


@pytest.fixture(scope="module")
def jobs(root: Path, gate: Gate) -> Iterator[dict[str, Job]]:
    started = {
        "hangfail": Job(root / "hangfail", "hang@rank=1,step=8;crash@rank=1,step=12,attempt=1",
                        ["--max-restarts", "2", "--restart-on-hang", "--hang-floor", "6"],
                        ["--steps", "16", "--ckpt-every", "4", "--step-time", "0.02"]),
        "recovering": Job(root / "recovering", f"lock:{gate.path}@rank=1,step=5;"
                          "signal:KILL@rank=1,step=6", *RECOVERING),
    }
    yield started
    for job in started.values():
        job.stop()


@pytest.fixture(scope="module")
def ui(root: Path, jobs: dict[str, Job]) -> Iterator[UiServer]:
    server = UiServer(root)
    yield server
    server.stop()


def url_of(ui: UiServer, job: Job) -> str:
    return f"{ui.url}/jobs/{job_id(job.dir.resolve())}"


def _rows(job: Job, sql: str) -> list[tuple[str, ...]]:
    """Rows of the job's store, read directly ([] before it exists)."""
    db = job.dir / "trainguard.db"
    if not db.is_file():
        return []
    try:
        with closing(sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)) as conn:
            return conn.execute(sql).fetchall()
    except sqlite3.Error:
        return []


def events_in(job: Job) -> list[str]:
    return [r[0] for r in _rows(job, "SELECT reason FROM events ORDER BY id")]


def _meta(job: Job) -> dict[str, str]:
    return dict(_rows(job, "SELECT key, value FROM meta"))


def test_the_job_list_renders_the_real_jobs(page: Page, ui: UiServer,
                                            jobs: dict[str, Job]) -> None:
    wait_for("both jobs' stores", lambda: all("JobRunning" in events_in(j)
                                              for j in jobs.values()))
    page.goto(ui.url + "/")
    rows = page.locator("tr.job-row")
    expect(rows).to_have_count(2, timeout=15_000)
    for job in jobs.values():
        row = page.locator(f'tr.job-row[data-job="{job_id(job.dir.resolve())}"]')
        expect(row.locator("td.path")).to_have_text(str(job.dir.resolve()))
        expect(row.locator(".state")).not_to_have_text("unreadable")
        expect(row.locator("a")).to_have_text(json.loads(_meta(job)["run_id"]))
    screenshot(page, "job-list")
    page.locator(f'tr[data-job="{job_id(jobs["recovering"].dir.resolve())}"] a').click()
    expect(page.locator("#timeline .attempt-bar").first).to_be_visible(timeout=15_000)


def test_a_running_jobs_timeline_and_events_grow_without_a_reload(
        page: Page, ui: UiServer, jobs: dict[str, Job], gate: Gate) -> None:
    job = jobs["recovering"]
    page.goto(url_of(ui, job))
    bars = page.locator("#timeline .attempt-bar")
    expect(bars).to_have_count(1, timeout=15_000)
    expect(bars.first).to_have_attribute("data-running", "yes")
    expect(page.locator("#live")).to_have_text("live", timeout=15_000)
    expect(page.locator('#events tr[data-reason="JobRunning"]')).to_have_count(1)
    assert "WorkerFailed" not in events_in(job)  # rank 1 still waits on the gate
    page.evaluate("window.__sameDocument = true")
    screenshot(page, "job-running")
    gate.release()  # rank 1 goes on: it dies at step 6, and the job restarts
    expect(bars).to_have_count(2, timeout=90_000)
    expect(bars.nth(1)).to_have_attribute("data-start-type", "auto_restart")
    for reason in ("WorkerFailed", "FailureDiagnosed", "WorkersRestarted"):
        expect(page.locator(f'#events tr[data-reason="{reason}"]')).to_have_count(
            1, timeout=30_000)
    expect(page.locator("#recoveries .recovery-item")).to_have_count(1)
    expect(page.locator("#recoveries .recovery-item")).to_contain_text("→ process_restart →")
    assert job.wait(120) == 0, job.output()
    expect(page.locator("#state .state")).to_have_text("succeeded", timeout=30_000)
    expect(page.locator("#live")).to_have_text("ended", timeout=30_000)
    expect(page.locator(".recovery-item .result")).to_have_text("success")
    assert page.evaluate("window.__sameDocument") is True  # never reloaded
    screenshot(page, "job-recovered")
    # walk-through 38 #5: the page left open follows a relaunch of the same command (it
    # stayed "ended" through it); the finished job runs again and ends at once
    again = Job(job.dir, None, *RECOVERING)
    try:
        assert again.wait(120) == 0, again.output()
    finally:
        again.stop()
    expect(bars).to_have_count(3, timeout=30_000)
    expect(page.locator('#events tr[data-reason="JobRelaunched"]')).to_have_count(1)
    expect(page.locator('#events tr[data-reason="JobSucceeded"]')).to_have_count(2)
    assert page.evaluate("window.__sameDocument") is True


def test_a_failed_job_shows_its_diagnosis_with_the_deciding_line(
        page: Page, ui: UiServer, jobs: dict[str, Job]) -> None:
    job = jobs["hangfail"]
    assert job.wait(150) == 1, job.output()
    page.goto(url_of(ui, job))
    card = page.locator("#diagnoses .diagnosis")
    expect(card).to_have_count(1, timeout=15_000)
    expect(card.locator(".cat")).to_have_text("user_code_error")
    expect(card.locator(".evidence .mark-decisive")).to_have_text(
        "RuntimeError: injected crash at step 12")
    decisive = page.locator("#log .ln.mark-decisive")
    expect(decisive).to_have_count(1, timeout=15_000)
    expect(decisive).to_contain_text("injected crash at step 12")
    expect(page.locator("#log-attempt")).to_have_value("1")
    expect(page.locator("#log-rank")).to_have_value("1")
    expect(page.locator("#state .state")).to_have_text("failed")
    screenshot(page, "job-failed")


def test_a_log_answered_late_does_not_replace_the_one_asked_for_after_it(
        page: Page, ui: UiServer, jobs: dict[str, Job]) -> None:
    """The page first fills the log picker from the job's newest attempt (rank 0) and then
    from its diagnosis (rank 1): when rank 0's answer comes back last, the pane must still
    show rank 1's log with its deciding line (CI saw the pane left on rank 0 under load)."""
    job = jobs["hangfail"]
    assert job.wait(150) == 1, job.output()

    def late(route: Route) -> None:
        time.sleep(1.5)
        route.continue_()

    page.route("**/logs/1/0?*", late)
    page.goto(url_of(ui, job))
    decisive = page.locator("#log .ln.mark-decisive")
    expect(decisive).to_have_count(1, timeout=15_000)
    page.wait_for_timeout(2500)  # every late answer is in by now
    expect(decisive).to_have_count(1)
    expect(page.locator("#log-rank")).to_have_value("1")
    expect(page.locator("#log-info")).to_contain_text("rank-1.log")


def test_a_hung_job_shows_every_ranks_stack_and_the_culprit(
        page: Page, ui: UiServer, jobs: dict[str, Job]) -> None:
    job = jobs["hangfail"]
    assert job.wait(150) == 1, job.output()
    page.goto(url_of(ui, job))
    hang = page.locator("#hangs .hang")
    expect(hang).to_have_count(1, timeout=15_000)
    stacks = hang.locator(".stack")
    expect(stacks).to_have_count(2)
    culprit = hang.locator(".stack-culprit")
    expect(culprit).to_have_attribute("data-rank", "1")
    expect(culprit.locator("pre")).to_contain_text("time_sleep")
    expect(hang.locator('.stack[data-rank="0"] pre')).to_contain_text("Thread")
    expect(hang.locator(".culprit")).to_contain_text("rank 1")
    bars = page.locator("#timeline .attempt-bar")
    expect(bars).to_have_count(2)
    expect(bars.nth(1)).to_have_attribute("data-start-type", "suspension_restart")
    screenshot(page, "job-hang")
