"""Pre-warmed standby workers (node/standby.py, worker/standby.py): real processes.

A standby must be indistinguishable to the script from a fresh `python -u script`: what the
script sees of itself is compared with a cold start of the same command, environment and
directory. Then the launcher's use of them: restarted ranks come from standbys, and none is
left behind when the job ends.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from tests.integration.conftest import EXAMPLE, TG, read_json, reasons, run_tg
from trainguard.node import procs
from trainguard.node.standby import FILL_AFTER_S, StandbyPool
from trainguard.worker.standby import WARM_NICE

pytestmark = pytest.mark.integration

PROBE = textwrap.dedent("""\
    import json, os, signal, sys, time
    if __name__ == "__main__":
        start = os.getpid()
        what = {"name": __name__, "argv": sys.argv, "cwd": os.getcwd(),
                "path0": sys.path[0], "stdin": sys.stdin.read(), "tg": os.environ.get("TG_X"),
                "rank": os.environ.get("RANK"), "unbuffered": sys.stdout.write_through,
                "sigterm": str(signal.getsignal(signal.SIGTERM)),
                "sigint": str(signal.getsignal(signal.SIGINT)),
                "main_file": sys.modules["__main__"].__file__, "orig_argv": sys.orig_argv,
                "nice": [os.getpriority(os.PRIO_PROCESS, int(t))
                         for t in os.listdir("/proc/self/task")]}
        print(json.dumps(what), flush=True)
        mode = sys.argv[1]
        if mode == "exit":
            assert os.getpid() == start
            sys.exit(3)
        if mode == "raise":
            def inner():
                raise ValueError("boom")
            inner()
        if mode == "term":
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
""")


def start(pool: StandbyPool | None, argv: list[str], env: dict[str, str], cwd: str
          ) -> subprocess.Popen[bytes]:
    proc = pool.take(argv, env, cwd) if pool is not None else None
    return proc or procs.spawn(argv, env, cwd)


def outcome(proc: subprocess.Popen[bytes]) -> tuple[dict[str, object], int, list[str]]:
    out, err = proc.communicate(timeout=60)
    lines = out.decode().splitlines()
    assert lines, err.decode()[-3000:]
    return json.loads(lines[0]), proc.returncode, err.decode().splitlines()


@pytest.fixture
def pool() -> StandbyPool:
    guardian = procs.Guardian("")
    p = StandbyPool(guardian, imports=("json",))
    yield p
    p.close()
    guardian.close()


@pytest.mark.parametrize(("mode", "relative"), [("exit", False), ("raise", False),
                                                ("term", False), ("exit", True)])
def test_a_standby_is_indistinguishable_from_a_cold_start(
        tmp_path: Path, pool: StandbyPool, mode: str, relative: bool) -> None:
    """`relative`: the script named from the directory (walk-through 28: the standby's
    `__file__` was relative where a cold start's is absolute)."""
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    env = {**os.environ, "TG_X": "1", "RANK": "0", "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-u", "probe.py" if relative else str(script), mode]
    pool.configure(1, argv, {**env, "RANK": "5"}, str(tmp_path))  # another rank's: fine
    pool.maintain(None)
    assert len(pool) == 0  # not before the attempt's first step (and FILL_AFTER_S)
    pool.maintain(FILL_AFTER_S)
    assert len(pool) == 1
    wait_warm(pool, 1)
    (pid,) = pool.pids()  # importing at a lower priority (as root it can go back after)
    assert psutil.Process(pid).nice() == min(os.getpriority(os.PRIO_PROCESS, 0) + WARM_NICE, 19)
    warm = start(pool, argv, env, str(tmp_path))
    assert pool.taken == 1
    cold = start(None, argv, env, str(tmp_path))
    (w_what, w_rc, w_err), (c_what, c_rc, c_err) = outcome(warm), outcome(cold)
    assert w_what == c_what and w_what["stdin"] == "" and w_what["name"] == "__main__"
    assert w_rc == c_rc == {"exit": 3, "raise": 1, "term": -signal.SIGTERM}[mode]
    assert w_err == c_err  # the same traceback: from the script's first frame


def wait_warm(pool: StandbyPool, n: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while pool.warm() < n:
        assert time.monotonic() < deadline, f"{pool.warm()} of {n} standbys warm"
        time.sleep(0.05)


def test_a_standby_says_when_it_is_warm_and_one_taken_before_goes_on_at_full_priority(
        tmp_path: Path) -> None:
    """`warm()` counts a standby once its imports are done (status: ready, the others
    warming); one taken while still importing is raised back to the agent's priority at
    once, not left to import at the standby's lower one until it reads its assignment."""
    (tmp_path / "slowmod.py").write_text("import time\ntime.sleep(4)\n")
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    argv = [sys.executable, "-u", str(script), "exit"]
    guardian = procs.Guardian("")
    pool = StandbyPool(guardian, imports=("slowmod",))
    try:
        pool.configure(1, argv, env, str(tmp_path))
        pool.maintain(FILL_AFTER_S)
        (pid,) = pool.pids()
        agent_nice = os.getpriority(os.PRIO_PROCESS, 0)
        deadline = time.monotonic() + 30
        while psutil.Process(pid).nice() == agent_nice:  # it lowers its own priority first
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert pool.warm() == 0  # importing slowmod
        proc = pool.take(argv, env, str(tmp_path))
        assert proc is not None and proc.pid == pid
        assert {t.id: psutil.Process(t.id).nice() for t in psutil.Process(pid).threads()} \
            == {t.id: agent_nice for t in psutil.Process(pid).threads()}
        what, rc, _ = outcome(proc)
        assert rc == 3 and set(what["nice"]) == {agent_nice}  # type: ignore[arg-type]
    finally:
        pool.close()
        guardian.close()


def test_a_module_run_with_dash_m_is_the_same_too(tmp_path: Path, pool: StandbyPool) -> None:
    (tmp_path / "probemod.py").write_text(PROBE)
    env = {**os.environ, "TG_X": "2", "PYTHONPATH": str(tmp_path)}
    argv = [sys.executable, "-u", "-m", "probemod", "exit"]
    pool.configure(1, argv, env, str(tmp_path))
    pool.maintain(FILL_AFTER_S)
    warm, cold = start(pool, argv, env, str(tmp_path)), start(None, argv, env, str(tmp_path))
    (w_what, w_rc, _), (c_what, c_rc, _) = outcome(warm), outcome(cold)
    assert w_what == c_what and w_rc == c_rc == 3


def test_a_standby_is_not_used_when_the_environment_or_the_command_differs(
        tmp_path: Path, pool: StandbyPool) -> None:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    env = {**os.environ, "TG_X": "1"}
    argv = [sys.executable, "-u", str(script), "exit"]
    pool.configure(1, argv, env, str(tmp_path))
    pool.maintain(FILL_AFTER_S)
    assert pool.take(argv, {**env, "OMP_NUM_THREADS": "7"}, str(tmp_path)) is None  # import-time
    assert pool.take(["/bin/true"], env, str(tmp_path)) is None  # --no-python: never
    assert len(pool) == 0  # the mismatched one was ended, not kept
    pool.configure(0, ["/bin/true"], env, str(tmp_path))
    pool.maintain(FILL_AFTER_S)
    assert len(pool) == 0


def standbys_in(cwd: Path) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if "trainguard.worker.standby" in " ".join(p.info["cmdline"] or []) and \
                    Path(p.cwd()) == cwd:
                found.append(p)
        except psutil.Error:
            continue
    return found


def test_restarted_ranks_come_from_standbys_and_none_is_left_behind(
        tmp_path: Path) -> None:
    job = tmp_path / "job"
    r = run_tg(["run", "--nproc-per-node", "2", "--job-dir", str(job), "--max-restarts", "2",
                "--restart-backoff", "0", str(EXAMPLE), "--steps", "80", "--ckpt-every", "10",
                "--step-time", "0.2"], cwd=tmp_path, fault="signal:KILL@rank=1,step=70")
    assert r.returncode == 0, r.stderr[-3000:]
    restarted = next(e for e in read_json("events", job) if e["reason"] == "WorkersRestarted")
    assert restarted["message"].count("(standby)") == 2, restarted["message"]
    assert not standbys_in(tmp_path)


def test_the_in_process_replacement_comes_from_a_standby(tmp_path: Path) -> None:
    job = tmp_path / "job"
    r = run_tg(["run", "--nproc-per-node", "2", "--job-dir", str(job), "--max-restarts", "2",
                str(EXAMPLE), "--steps", "80", "--ckpt-every", "10", "--step-time", "0.2",
                "--resilient"], cwd=tmp_path, fault="signal:KILL@rank=1,step=70")
    assert r.returncode == 0, r.stderr[-3000:]
    done = next(e for e in read_json("events", job) if e["reason"] == "InProcessRestarted")
    assert "rank(s) 1 from a pre-warmed standby" in done["message"]
    assert "InProcessRestarting" in reasons(job)
    assert not standbys_in(tmp_path)


def test_a_launcher_killed_with_sigkill_takes_its_standbys_with_it(tmp_path: Path) -> None:
    job = tmp_path / "job"
    proc = subprocess.Popen([*TG, "run", "--nproc-per-node", "2", "--job-dir", str(job),
                             str(EXAMPLE), "--steps", "400", "--step-time", "0.2"],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while len(standbys_in(tmp_path)) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert len(standbys_in(tmp_path)) == 2  # filled FILL_AFTER_S after the first step
        proc.kill()
        proc.wait(timeout=10)
        deadline = time.monotonic() + 15
        while standbys_in(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not standbys_in(tmp_path)  # the guardian ended them with the workers
    finally:
        if proc.poll() is None:
            proc.kill()
