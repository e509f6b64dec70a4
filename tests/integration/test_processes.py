"""No orphans, no zombies, bounded memory: the launcher's process handling, for real."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest

from tests.integration.conftest import TG, read_json

pytestmark = pytest.mark.integration

# A worker that starts a child of its own (like a DataLoader worker) and one that leaves
# its process group (setsid, like a daemonising helper), then waits.
SLEEPER = textwrap.dedent("""
    import os, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    loner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                             start_new_session=True)
    print(f"step 1 child {child.pid} loner {loner.pid}", flush=True)
    time.sleep(600)
""")


def _marked(marker_pids: set[int]) -> list[int]:
    return [p for p in marker_pids if psutil.pid_exists(p)
            and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def _start(tmp_path: Path, script: str, *flags: str, stdout: int = subprocess.PIPE
           ) -> tuple[subprocess.Popen[str], Path]:
    path = tmp_path / "worker.py"
    path.write_text(script)
    job = tmp_path / "job"
    proc = subprocess.Popen([*TG, "run", "--nproc-per-node", "2", "--job-dir", str(job),
                             "--grace-period", "3", *flags, str(path)],
                            cwd=tmp_path, stdout=stdout, stderr=subprocess.PIPE,
                            text=True)
    return proc, job


def _workers_and_children(launcher: int, timeout: float = 60) -> set[int]:
    """Every descendant of the launcher once both workers have started their child."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        kids = psutil.Process(launcher).children(recursive=True)
        cmdlines = [" ".join(k.cmdline()) for k in kids if k.is_running()]
        if sum("time.sleep(600)" in c for c in cmdlines) >= 4:
            return {k.pid for k in kids}
        time.sleep(0.2)
    raise AssertionError("workers did not start in time")


def _gone(pids: set[int], timeout: float = 15) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = _marked(pids)
        if not left:
            return []
        time.sleep(0.2)
    return _marked(pids)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signalled_launcher_stops_every_worker_and_exits_with_128_plus_the_signal(
        tmp_path: Path, sig: signal.Signals) -> None:
    proc, job = _start(tmp_path, SLEEPER)
    pids = _workers_and_children(proc.pid)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err[-2000:]
    assert _gone(pids) == []
    events = [e["reason"] for e in read_json("events", job)]
    assert events[-1] == "JobStopped"
    assert read_json("status", job)["state"] == "stopped"


def test_a_launcher_killed_with_sigkill_takes_its_workers_and_their_children_with_it(
        tmp_path: Path) -> None:
    proc, job = _start(tmp_path, SLEEPER)
    pids = _workers_and_children(proc.pid)
    # the children exist a moment before the line is printed: wait until the launcher has
    # read it (its console echo), then kill it; the line must be in the file by then
    assert proc.stdout is not None
    out = proc.stdout
    seen = threading.Event()

    def watch() -> None:
        for line in out:
            if line.startswith("[rank 0] step 1 child"):
                seen.set()
                return

    threading.Thread(target=watch, daemon=True).start()
    assert seen.wait(30)
    proc.kill()
    proc.wait(timeout=10)
    assert _gone(pids) == []  # the setsid "loner" too: the guardian sweeps the job's marker
    assert read_json("status", job)["state"] == "lost"  # nothing could record the end
    rank_log = job / "logs" / "attempt-0" / "rank-0.log"
    assert "step 1 child" in rank_log.read_text()  # on disk as read, not lost with the launcher


def test_a_worker_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path: Path) -> None:
    stubborn = textwrap.dedent("""
        import os, signal, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("step 1", flush=True)
        if os.environ["RANK"] == "1":
            open("rank1-ignores-sigterm", "w").close()
            time.sleep(600)
        while not os.path.exists("rank1-ignores-sigterm"):
            time.sleep(0.01)
        sys.exit(5)
    """)
    path = tmp_path / "w.py"
    path.write_text(stubborn)
    t0 = time.monotonic()
    r = subprocess.run([*TG, "run", "--nproc-per-node", "2", "--job-dir", str(tmp_path / "j"),
                        "--grace-period", "2", str(path)], cwd=tmp_path, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1
    assert 2 <= time.monotonic() - t0 < 30
    ranks = read_json("status", tmp_path / "j")["ranks"]
    assert [(w["state"], w["signal"]) for w in ranks] == [("failed", None),
                                                          ("stopped", "SIGKILL")]
    assert _gone({w["pid"] for w in ranks}) == []


def test_a_job_that_prints_megabytes_per_second_does_not_grow_the_launchers_memory(
        tmp_path: Path) -> None:
    loud = textwrap.dedent("""
        import sys
        line = "x" * 1000 + "\\n"
        n = 0
        while n < 40:  # a fixed amount, not a time: a loaded machine writes it too, slower
            sys.stdout.write(line * 1000)   # 1 MB a write
            n += 1
        sys.stdout.write("y" * 20_000_000)  # one 20 MB line with no newline
        sys.stdout.flush()
        print(f"\\nwrote {n} MB", file=sys.stderr)
    """)
    proc, job = _start(tmp_path, loud, stdout=subprocess.DEVNULL)  # console echo on
    launcher = psutil.Process(proc.pid)
    log = job / "logs" / "attempt-0" / "rank-0.log"
    deadline = time.monotonic() + 60  # the launcher's own start-up is not growth: the base is
    while (not log.is_file() or log.stat().st_size == 0) and time.monotonic() < deadline:
        time.sleep(0.05)  # taken once the rank writes (a fixed 1 s read 15 MiB at a load of 10)
    base = launcher.memory_info().rss
    peak = base
    while proc.poll() is None:
        try:
            peak = max(peak, launcher.memory_info().rss)
        except psutil.NoSuchProcess:
            break
        time.sleep(0.05)
    assert proc.returncode == 0
    written = (job / "logs" / "attempt-0" / "rank-0.log").stat().st_size
    assert written > 50_000_000  # it really printed a lot
    assert peak - base < 40 * 1024 * 1024, f"launcher grew {(peak - base) / 2**20:.0f} MiB"


def test_workers_get_torchruns_environment_and_trainguards_own(tmp_path: Path) -> None:
    dump = textwrap.dedent("""
        import json, os, sys
        keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
                "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE", "PYTHON_EXEC",
                "OMP_NUM_THREADS", "TRAINGUARD_PROCESS_START_COUNT",
                "TRAINGUARD_SCHEDULE_COUNT", "TRAINGUARD_JOB_DIR", "TRAINGUARD_CHECKPOINT_DIR"]
        print("ENV " + json.dumps({k: os.environ.get(k) for k in keys}))
        print("ARGV " + json.dumps(sys.argv[1:]))
    """)
    path = tmp_path / "env.py"
    path.write_text(dump)
    r = subprocess.run([*TG, "run", "--nproc_per_node", "2", "--run_id", "envtest",
                        "--max_restarts", "4", str(path), "--lr", "3e-4", "--", "x y"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr

    envs = sorted((json.loads(ln.split("ENV ", 1)[1]) for ln in r.stdout.splitlines()
                   if "ENV " in ln), key=lambda e: e["RANK"])
    assert [e["RANK"] for e in envs] == ["0", "1"]
    argvs = [json.loads(ln.split("ARGV ", 1)[1]) for ln in r.stdout.splitlines() if "ARGV " in ln]
    assert argvs == [["--lr", "3e-4", "--", "x y"]] * 2
    e1 = envs[1]
    assert e1["LOCAL_RANK"] == "1" and e1["WORLD_SIZE"] == "2" and e1["LOCAL_WORLD_SIZE"] == "2"
    assert e1["GROUP_RANK"] == "0" and e1["ROLE_RANK"] == "1" and e1["ROLE_WORLD_SIZE"] == "2"
    assert e1["TORCHELASTIC_RESTART_COUNT"] == "0" and e1["TORCHELASTIC_MAX_RESTARTS"] == "4"
    assert e1["TORCHELASTIC_RUN_ID"] == "envtest" and e1["OMP_NUM_THREADS"] == "1"
    assert e1["TORCHELASTIC_ERROR_FILE"].endswith("attempt-0/rank-1.error.json")
    assert e1["PYTHON_EXEC"] == sys.executable
    assert e1["TRAINGUARD_PROCESS_START_COUNT"] == "1" and e1["TRAINGUARD_SCHEDULE_COUNT"] == "1"
    job = tmp_path / "trainguard-runs" / "envtest"
    assert e1["TRAINGUARD_JOB_DIR"] == str(job)
    assert e1["TRAINGUARD_CHECKPOINT_DIR"] == str(job / "checkpoints")
    assert os.path.isdir(job / "checkpoints")


def test_a_successful_job_leaves_no_child_behind_and_logs_everything(tmp_path: Path) -> None:
    mark = f"time.sleep(600)  # {uuid.uuid4().hex}"  # this test's sleepers, no other's
    leaver = textwrap.dedent(f"""
        import subprocess, sys
        subprocess.Popen([sys.executable, "-c", "import time; {mark}"])
        subprocess.Popen([sys.executable, "-c", "import time; {mark}"],
                         start_new_session=True)
        print("step 1 done", flush=True)
    """)
    before = {p.pid for p in psutil.process_iter()}
    path = tmp_path / "w.py"
    path.write_text(leaver)
    r = subprocess.run([*TG, "run", "--nproc-per-node", "2", "--job-dir", "j",
                        "--grace-period", "2", str(path)], cwd=tmp_path, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    time.sleep(0.5)
    left = [p for p in psutil.process_iter(["cmdline"]) if p.pid not in before
            and mark in " ".join(p.info["cmdline"] or [])]
    assert left == []
    for rank in (0, 1):
        assert "step 1 done" in (tmp_path / f"j/logs/attempt-0/rank-{rank}.log").read_text()


def test_a_rank_log_that_cannot_be_written_is_an_event_not_a_hang(tmp_path: Path) -> None:
    logs = tmp_path / "j" / "logs" / "attempt-0"
    logs.mkdir(parents=True)
    (logs / "rank-0.log").symlink_to("/dev/full")  # every write: No space left on device
    path = tmp_path / "w.py"
    path.write_text("for i in range(2000):\n    print('step', i, 'x' * 200, flush=True)\n")
    r = subprocess.run([*TG, "run", "--nproc-per-node", "2", "--job-dir", "j", str(path)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    events = read_json("events", tmp_path / "j")
    failed = [e for e in events if e["reason"] == "LogWriteFailed"]
    assert len(failed) == 1 and "No space left on device" in failed[0]["message"]
    assert read_json("status", tmp_path / "j")["last_progress"]["step"] == 1999


def test_a_second_launcher_on_a_running_job_is_refused(tmp_path: Path) -> None:
    proc, job = _start(tmp_path, SLEEPER)
    try:
        _workers_and_children(proc.pid)
        r = subprocess.run([*TG, "run", "--job-dir", str(job), "--no-python", "true"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2
        assert f"in use by a running launcher (pid {proc.pid})" in r.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
