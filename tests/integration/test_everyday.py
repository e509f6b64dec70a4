"""The everyday loop around a job, with real commands on a real job: `logs -f` follows a
rank across a restart, `stop` ends the job gracefully, `ls` lists it, `prune` removes it."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from tests.integration.conftest import EXAMPLE, TG, read_json


def _wait(pred, timeout: float = 90.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if pred():
                return
        except (subprocess.CalledProcessError, json.JSONDecodeError):
            pass
        time.sleep(0.3)
    raise AssertionError("timed out waiting")


def tg(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TG, *args], capture_output=True, text=True, timeout=timeout,
                          check=False)


def test_logs_follow_a_rank_across_a_restart_stop_ends_the_job_ls_and_prune_see_it(
        tmp_path: Path) -> None:
    root = tmp_path / "runs"
    job = root / "exp"
    env = {**os.environ, "TRAINGUARD_FAULT": "signal:KILL@rank=0,step=4,attempt=0"}
    launcher = subprocess.Popen(
        [*TG, "run", "--nproc-per-node", "2", "--max-restarts", "2", "--job-dir", str(job),
         str(EXAMPLE), "--steps", "400", "--step-time", "0.1", "--ckpt-every", "2"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait(lambda: (job / "trainguard.db").is_file())
        follower = subprocess.Popen([*TG, "logs", str(job), "--rank", "0", "-f"],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _wait(lambda: read_json("status", job)["attempt"] == 1
              and (read_json("status", job)["last_progress"]["step"] or 0) >= 8)
        status = read_json("status", job)
        assert status["launcher"]["pid"] == launcher.pid and status["launcher"]["alive"]
        stop = tg("stop", str(job), "--timeout", "60")
        assert stop.returncode == 0, stop.stderr
        assert f"SIGTERM to its launcher (pid {launcher.pid})" in stop.stdout
        assert "stopped (exit code 143)" in stop.stdout
        assert launcher.wait(timeout=30) == 143
        out, err = follower.communicate(timeout=30)  # -f ends by itself once the job ended
        assert follower.returncode == 0, err
    finally:
        if launcher.poll() is None:
            launcher.kill()
    before, _, after = out.partition("==> attempt 1 <==\n")
    assert " step 3 " in before and after, out[-2000:]
    assert " step 8 " in after  # the restarted attempt, resumed from step 4's checkpoint
    done = tg("stop", str(job))  # a note, not the command's output (walk-through 23)
    assert done.returncode == 0 and done.stdout == ""
    assert "already ended (stopped)" in done.stderr

    listed = json.loads(tg("ls", str(root), "--json").stdout)
    assert [(r["job_dir"], r["state"], r["attempts"]) for r in listed] == [
        (str(job.resolve()), "stopped", 2)]
    assert listed[0]["size_bytes"] > 0
    dry = tg("prune", str(root), "--older-than", "0")
    assert "would delete" in dry.stdout and job.exists()
    gone = tg("prune", str(root), "--older-than", "0", "--yes")
    assert gone.returncode == 0 and not job.exists()
    assert "no trainguard jobs" in tg("ls", str(root)).stdout


def test_stop_refuses_a_pid_that_is_not_the_launcher_any_more(tmp_path: Path) -> None:
    """The launcher died and its pid now belongs to another process: nothing is signalled."""
    import socket

    from trainguard.controller.store import JobStore

    other = subprocess.Popen(["sleep", "30"])
    try:
        with JobStore.create(tmp_path / "j", "run-x") as s:
            s.set_meta(state="running", launcher_pid=other.pid,
                       launcher_host=socket.gethostname())
        r = tg("stop", str(tmp_path / "j"))
        assert r.returncode == 2 and "not a trainguard launcher any more" in r.stderr
        assert other.poll() is None
    finally:
        other.kill()


def test_restart_args_are_added_on_every_attempt_but_the_first(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text("import os, sys\nprint('args', sys.argv[1:], flush=True)\n"
                      "sys.exit(1 if os.environ['TORCHELASTIC_RESTART_COUNT'] == '0' else 0)\n")
    r = subprocess.run([*TG, "run", "--max-restarts", "1", "--unconditional-restart",
                        "--restart-args=--init_from=resume --x 1", "--job-dir",
                        str(tmp_path / "j"), str(script), "--base"], capture_output=True,
                       text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "args ['--base']" in r.stdout
    assert "args ['--base', '--init_from=resume', '--x', '1']" in r.stdout


def test_a_job_that_reports_no_steps_shows_its_last_checkpoint_as_progress(
        tmp_path: Path) -> None:
    """`--quiet` prints no step lines; its committed checkpoints are its progress in
    `status`, `ls` and `metrics`, each saying so; before anything, no NaN step."""
    job = tmp_path / "runs" / "quiet"
    from trainguard.controller.store import JobStore

    with JobStore.create(tmp_path / "runs" / "empty", "run-e") as s:
        s.set_meta(state="pending")
    empty = tg("metrics", str(tmp_path / "runs" / "empty")).stdout
    assert "trainguard_job_state" in empty and "NaN" not in empty
    assert "\ntrainguard_step " not in empty
    assert "\ntrainguard_checkpoint_last_committed_step " not in empty
    r = tg("run", "--nproc-per-node", "1", "--job-dir", str(job), str(EXAMPLE), "--steps",
           "12", "--ckpt-every", "5", "--quiet", timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    assert " step 1 " not in r.stdout
    status = json.loads(tg("status", str(job), "--json").stdout)
    assert status["last_progress"]["step"] == 12  # the last save, at the end
    assert status["last_progress"]["source"] == "checkpoint"
    assert "(last committed checkpoint" in tg("status", str(job)).stdout
    listed = {r["job_dir"]: r for r in json.loads(tg("ls", str(job.parent), "--json").stdout)}
    assert listed[str(job.resolve())]["last_step"] == 12
    assert "12 (checkpoint)" in tg("ls", str(job.parent)).stdout
    metrics = tg("metrics", str(job)).stdout
    assert "\ntrainguard_step 12.0" in metrics
    assert 'trainguard_progress_source{source="checkpoint"} 1.0' in metrics


def test_workers_stopped_counts_the_workers_it_stopped(tmp_path: Path) -> None:
    """A 1-rank job has no other workers to stop: the event says so instead of "the other
    workers"; with 2 ranks it names the one it stopped."""
    script = tmp_path / "s.py"
    script.write_text("import os, sys, time\nif os.environ['RANK'] == '0':\n    sys.exit(3)\n"
                      "time.sleep(60)\n")
    for n, expected in (("1", "no other workers to stop (the job has 1 rank)"),
                        ("2", "stopped 1 other worker(s): rank(s) 1 (grace 3s)")):
        job = tmp_path / f"j{n}"
        r = tg("run", "--nproc-per-node", n, "--grace-period", "3", "--job-dir", str(job),
               str(script), timeout=120)
        assert r.returncode == 1, r.stderr[-2000:]
        events = json.loads(tg("events", str(job), "--json", "--reason", "WorkersStopped").stdout)
        assert [e["message"] for e in events] == [expected]


def test_stop_with_save_on_exit_ends_the_rank_once_its_save_is_durable(tmp_path: Path) -> None:
    """The rank saves its last step and exits 143 at once: not after the interpreter's
    shutdown, which waits for every non-daemon thread (here one that never ends) until the
    grace period's SIGKILL."""
    script = tmp_path / "s.py"
    script.write_text(
        "import threading, time, torch\nfrom trainguard.checkpoint import Checkpointer\n"
        "threading.Thread(target=time.sleep, args=(3600,)).start()  # never ends\n"
        "ckpt, state = Checkpointer(every_steps=1000, async_save=False), {'w': torch.zeros(2)}\n"
        "for step in range(1, 100000):\n    print(f'step {step}', flush=True)\n"
        "    time.sleep(0.1)\n    ckpt.maybe_save(step, state)\n")
    job = tmp_path / "j"
    launcher = subprocess.Popen([*TG, "run", "--save-on-exit", "--grace-period", "60",
                                 "--job-dir", str(job), str(script)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait(lambda: (read_json("status", job)["last_progress"]["step"] or 0) >= 3)
        started = time.monotonic()
        stop = tg("stop", str(job), "--timeout", "90", timeout=120)
        took = time.monotonic() - started
        assert stop.returncode == 0 and "stopped (exit code 143)" in stop.stdout, stop.stderr
    finally:
        if launcher.poll() is None:
            launcher.kill()
    rank = read_json("status", job)["ranks"][0]
    assert (rank["exit_code"], rank["signal"]) == (143, None)  # not SIGKILLed at the grace
    assert took < 45, took
    saved = json.loads(tg("events", str(job), "--json", "--reason", "CheckpointSaved").stdout)
    assert "on the way out" in saved[-1]["message"]


STUBBORN = """\
import signal, time, trainguard
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a script that will not stop on SIGTERM
for step in range(1, 100000):
    trainguard.progress(step)
    time.sleep(0.1)
"""


def test_a_stop_under_way_shows_in_status_and_a_stopped_or_lost_job_says_how_to_go_on(
        tmp_path: Path) -> None:
    """During the grace period `status` reads STOPPING (when, the signal, the grace) and the
    progress of ranks that train on, and the events have StopRequested; a job that ended
    lost (stop --force) tells how to continue it: the same command with its --job-dir."""
    script, job = tmp_path / "stubborn.py", tmp_path / "job"
    script.write_text(STUBBORN)

    def launch() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [*TG, "run", "--nproc-per-node", "1", "--grace-period", "60", "--job-dir",
             str(job), str(script)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def ended_and_says_how_to_continue(state: str) -> None:
        text = tg("status", str(job)).stdout
        assert state in text and "STOPPING" not in text, text
        assert f"continue it: run the same `trainguard run` command with --job-dir " \
               f"{job.resolve()}" in text, text

    launcher = launch()
    try:
        _wait(lambda: (read_json("status", job)["last_progress"]["step"] or 0) >= 3)
        assert read_json("status", job)["stopping"] is None
        stop = tg("stop", str(job), "--timeout", "2")
        assert stop.returncode == 1, stop.stdout + stop.stderr  # still in its grace period
        assert "the stop is under way" in stop.stderr and "the ranks have the grace period " \
            "(60s) to exit, then SIGKILL" in stop.stderr, stop.stderr
        status = read_json("status", job)
        assert status["state"] == "running" and status["stopping"]["signal"] == "SIGTERM"
        assert status["stopping"]["grace_s"] == 60
        # the rank trains on through the grace period, and status shows it (walk-through 30:
        # progress froze at the step of the stop while the stop ran)
        at_stop = status["last_progress"]["step"]
        _wait(lambda: read_json("status", job)["last_progress"]["step"] >= at_stop + 20,
              timeout=15)
        text = tg("status", str(job)).stdout
        assert "running · STOPPING" in text and "the ranks have 60s to exit" in text, text
        assert "continue it:" not in text and "(stop the job:" not in text, text
        assert [e["reason"] for e in read_json("events", job)].count("StopRequested") == 1
        waits = tg("stop", str(job), "--timeout", "1")  # a stop under way is not sent again
        assert waits.returncode == 1 and "is under way: waiting for its launcher" in \
            waits.stdout, waits.stdout + waits.stderr
        again = tg("stop", str(job), "--now", "--timeout", "20")  # --now: no more grace
        assert again.returncode == 0, again.stdout + again.stderr
        launcher.wait(timeout=30)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    ended_and_says_how_to_continue("stopped")
    ended = next(e for e in read_json("events", job) if e["reason"] == "JobStopped")
    assert "got SIGKILL (a second signal cut the grace period short)" in ended["message"]
    # a launcher killed outright (what `stop --force` does to one that does not end): lost
    launcher = launch()
    try:
        _wait(lambda: read_json("status", job)["attempt"] == 1)
        launcher.kill()
        launcher.wait(timeout=30)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    ended_and_says_how_to_continue("lost")
