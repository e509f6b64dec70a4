"""The browser tests' machinery: Debian's chromium (installed with apt-get when missing; the
tests fail, never skip, without it) driven by Playwright for Python, a real `trainguard ui`
server started as a subprocess on a free loopback port, and real jobs run by `trainguard run`.

Screenshots go to tests/browser/screenshots/ (ignored by git); each test prints its paths.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "train_ddp.py"
TG = [sys.executable, "-m", "trainguard"]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
SHOTS = Path(__file__).resolve().parent / "screenshots"
FAST = ["--restart-backoff", "0.1", "--grace-period", "3"]
_URL = re.compile(r"(http://\S+)")


def ensure_chromium(timeout_s: float = 900) -> str:
    """The system chromium, installed with apt-get (update once, then install) if missing;
    a failure to get it fails the tests (pytest.fail), with apt-get's output."""
    if os.access(CHROMIUM, os.X_OK):
        return CHROMIUM
    if shutil.which("apt-get") is None:
        pytest.fail(f"{CHROMIUM} is missing and there is no apt-get: install Debian's chromium")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "chromium"]):
        try:
            r = subprocess.run(argv, env=env, capture_output=True, text=True,
                               timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            pytest.fail(f"`{' '.join(argv)}` took over {timeout_s:.0f} s")
        if r.returncode != 0:
            pytest.fail(f"`{' '.join(argv)}` failed (exit {r.returncode}); the browser tests "
                        f"need Debian's chromium (run as root with package mirrors reachable):"
                        f"\n{(r.stdout + r.stderr)[-3000:]}")
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"apt-get installed chromium, yet {CHROMIUM} is not there")
    return CHROMIUM


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    exe = ensure_chromium()
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1300, "height": 900})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    yield pg
    context.close()
    assert not errors, f"the page raised: {errors}"


def screenshot(page: Page, name: str) -> Path:
    SHOTS.mkdir(exist_ok=True)
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    return path


class Job:
    """A real `trainguard run` in the background (2 ranks of examples/train_ddp.py)."""

    def __init__(self, job_dir: Path, fault: str | None, flags: list[str],
                 script: list[str]) -> None:
        self.dir = job_dir
        env = {k: v for k, v in os.environ.items() if k != "TRAINGUARD_FAULT"}
        if fault is not None:
            env["TRAINGUARD_FAULT"] = fault
        self.log = open(job_dir.parent / f"{job_dir.name}.out", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [*TG, "run", "--nproc-per-node", "2", "--job-dir", str(job_dir), *FAST, *flags,
             str(EXAMPLE), *script], cwd=job_dir.parent, env=env, stdout=self.log,
            stderr=subprocess.STDOUT)

    def wait(self, timeout: float = 150) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self.log.flush()

    def output(self) -> str:
        self.log.flush()
        return (self.dir.parent / f"{self.dir.name}.out").read_text()[-4000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


class UiServer:
    """`trainguard ui --root ROOT --port 0` as a subprocess; `url` from its first line."""

    def __init__(self, root: Path) -> None:
        self.proc = subprocess.Popen([*TG, "ui", "--root", str(root), "--port", "0"],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        assert self.proc.stdout is not None
        line = _first_line(self.proc.stdout, timeout=30)
        m = _URL.search(line)
        if m is None:
            self.stop()
            pytest.fail(f"`trainguard ui` printed no URL: {line!r}")
        self.url = m.group(1).rstrip("/")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def _first_line(stream: IO[str], timeout: float) -> str:
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return got[0] if got else ""


def wait_for(what: str, check: Callable[[], bool], timeout: float = 60,
             every: float = 0.2) -> None:
    """Poll `check()` until it is true; fail naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(every)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
