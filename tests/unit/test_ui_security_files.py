"""Walk-through 32 #5: the dashboard serves only regular files inside the job dir it lists,
owned by that dir's owner, never through a symlink. A job dir under a shared `--root` is
whoever made it: its symlinked rank logs, stack dumps and hang.json, a store's `log_dir`
outside it and a symlinked store must not make the dashboard read a file of its own user's
for anybody who can reach it. Real stores in tmp_path; one check against the real process."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from starlette.testclient import TestClient

from tests.unit.helpers import TG
from tests.unit.test_ui_api import api_client, make_job
from trainguard.controller.store import JobStore
from trainguard.ui import jobfiles
from trainguard.ui.catalog import Catalog, job_id

SECRET = "e64e60a91b5d425df2ef93f8ffee4b28 the job token"


@pytest.fixture
def shared(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A shared root with one planted job, and a secret file beside it: (root, job, secret)."""
    secret = tmp_path / "secret"
    secret.write_text(SECRET + "\n")
    secret.chmod(0o600)
    root = tmp_path / "shared"
    job = root / "evil"
    make_job(job).close()
    return root, job, secret


def _client(root: Path) -> TestClient:
    return api_client(Catalog([], root=root))


def _relink(path: Path, target: Path) -> None:
    path.unlink()
    path.symlink_to(target)


def test_a_symlinked_rank_log_is_refused_with_why(shared: tuple[Path, Path, Path]) -> None:
    root, job, secret = shared
    _relink(job / "logs" / "attempt-0" / "rank-0.log", secret)
    with _client(root) as c:
        base = f"/api/jobs/{job_id(job.resolve())}/logs"
        for url in (f"{base}/0/0?tail=5", f"{base}/0/0?line=1"):
            r = c.get(url)
            assert r.status_code == 403, r.text
            assert "symbolic link" in r.json()["error"] and SECRET not in r.text
        assert (0, 0) not in [(x["attempt"], x["rank"]) for x in c.get(base).json()]
        assert c.get(f"{base}/0/1?tail=5").status_code == 200  # its real logs still serve


def test_symlinked_stack_dumps_and_hang_json_are_left_out_and_named(
        shared: tuple[Path, Path, Path]) -> None:
    root, job, secret = shared
    stacks = job / "logs" / "attempt-0" / "stacks"
    _relink(stacks / "rank-1.txt", secret)
    _relink(stacks / "hang.json", secret)
    (stacks / "rank-0.txt").symlink_to(secret)
    with _client(root) as c:
        r = c.get(f"/api/jobs/{job_id(job.resolve())}/hangs")
    assert r.status_code == 200 and SECRET not in r.text
    (hang,) = r.json()
    assert len(hang["refused"]) == 3 and all("symbolic link" in x for x in hang["refused"])
    assert hang["ranks"][1]["frames"] == ["sleep (time:0)"]  # the event's frames instead


@pytest.mark.parametrize("how", ["meta", "symlinked dir"])
def test_a_log_dir_out_of_another_users_job_dir_is_refused(
        shared: tuple[Path, Path, Path], tmp_path: Path, how: str) -> None:
    """A job dir others can write to (or another user's) cannot send the dashboard to a log
    dir outside it: not by its store's log_dir, not by a symlinked logs dir."""
    root, job, _ = shared
    elsewhere = tmp_path / "private-logs"
    shutil.copytree(job / "logs", elsewhere)
    if how == "meta":
        with JobStore.create(job, "tg-ui") as store:
            store.set_meta(log_dir=str(elsewhere))
    else:
        shutil.rmtree(job / "logs")
        (job / "logs").symlink_to(elsewhere)
    job.chmod(0o777)  # not the dashboard user's private dir
    with _client(root) as c:
        base = f"/api/jobs/{job_id(job.resolve())}"
        for url in (f"{base}/logs/0/1?tail=5", f"{base}/logs"):
            r = c.get(url)
            assert r.status_code == 403 and "outside its job dir" in r.json()["error"], r.text
        assert "outside its job dir" in c.get(f"{base}/hangs").json()[0]["refused"][0]
        job.chmod(0o755)  # the user's own job with --log-dir elsewhere: served
        assert c.get(f"{base}/logs/0/1?tail=5").status_code == 200


def test_a_fifo_is_refused_at_once_not_waited_on(shared: tuple[Path, Path, Path]) -> None:
    root, job, _ = shared
    log = job / "logs" / "attempt-0" / "rank-0.log"
    log.unlink()
    os.mkfifo(log)
    started = time.monotonic()
    with _client(root) as c:
        r = c.get(f"/api/jobs/{job_id(job.resolve())}/logs/0/0")
    assert r.status_code == 403 and "FIFO" in r.json()["error"]
    assert time.monotonic() - started < 5


def test_a_symlinked_store_is_not_shown_as_this_dirs_job(shared: tuple[Path, Path, Path],
                                                          tmp_path: Path) -> None:
    root, _, _ = shared
    private = tmp_path / "alice-private"
    make_job(private).close()
    planted = root / "planted"
    planted.mkdir()
    (planted / "trainguard.db").symlink_to(private / "trainguard.db")
    assert planted.resolve() not in Catalog([], root=root).jobs().values()
    with api_client(Catalog([planted])) as c:  # named by hand
        jid = job_id(planted.resolve())
        assert "symbolic link" in c.get("/api/jobs").json()[0]["error"]
        r = c.get(f"/api/jobs/{jid}/events")
        assert r.status_code == 403 and "symbolic link" in r.json()["error"]
    (planted / "trainguard.db").unlink()  # its own store, another's write-ahead log on it
    make_job(planted).close()
    (planted / "trainguard.db-wal").unlink(missing_ok=True)
    (planted / "trainguard.db-wal").symlink_to(private / "trainguard.db-wal")
    with api_client(Catalog([planted])) as c:
        r = c.get(f"/api/jobs/{job_id(planted.resolve())}")
        assert r.status_code == 403 and "trainguard.db-wal is a symbolic link" in r.text


def test_a_job_dir_swapped_for_a_symlink_after_it_was_listed_is_refused(
        shared: tuple[Path, Path, Path], tmp_path: Path) -> None:
    root, _, _ = shared
    group = root / "group"
    job = group / "evil"
    make_job(job).close()
    with _client(root) as c:
        jid = job_id(job.resolve())
        assert c.get(f"/api/jobs/{jid}/logs/0/1").status_code == 200  # listed, found
        other = tmp_path / "other"
        other.mkdir()
        shutil.copytree(job, other / "evil")
        group.rename(tmp_path / "moved")
        group.symlink_to(other)
        r = c.get(f"/api/jobs/{jid}/logs/0/1")
        assert r.status_code == 403 and "symlink" in r.json()["error"], r.text


def test_a_file_of_another_owner_is_refused() -> None:
    """A hard link to somebody else's file is theirs: only the job dir owner's are served."""
    st = os.stat_result((0o100644, 0, 0, 1, 4242, 0, 10, 0, 0, 0))
    with pytest.raises(jobfiles.Refused, match="owned by uid 4242, not by the job dir's owner"):
        jobfiles.check_file(st, 1000, Path("/x/rank-0.log"))
    jobfiles.check_file(os.stat_result((0o100644, 0, 0, 1, 1000, 0, 10, 0, 0, 0)), 1000,
                        Path("/x/rank-0.log"))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another uid")
def test_a_real_file_of_another_owner_is_not_served(shared: tuple[Path, Path, Path]) -> None:
    root, job, _ = shared
    os.chown(job / "logs" / "attempt-0" / "rank-1.log", 65534, 65534)
    with _client(root) as c:
        r = c.get(f"/api/jobs/{job_id(job.resolve())}/logs/0/1")
    assert r.status_code == 403 and "owned by uid 65534" in r.json()["error"]


def test_the_real_dashboard_refuses_a_planted_symlink(shared: tuple[Path, Path, Path]) -> None:
    root, job, secret = shared
    _relink(job / "logs" / "attempt-0" / "rank-0.log", secret)
    proc = subprocess.Popen([*TG, "ui", "--root", str(root), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        m = re.search(r":(\d+)/", proc.stdout.readline())
        assert m
        url = f"http://127.0.0.1:{m.group(1)}/api/jobs/{job_id(job.resolve())}/logs/0/0?tail=5"
        r = httpx.get(url, timeout=10)
        assert r.status_code == 403 and SECRET not in r.text
        assert "symbolic link" in r.json()["error"]
    finally:
        proc.terminate()
        proc.wait(10)
