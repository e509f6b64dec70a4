"""What the eighteenth new-user walk-through met, with the real command."""

from __future__ import annotations

import json
from pathlib import Path

from tests.unit.helpers import tg


def test_prune_keeps_what_trainguard_did_not_write(tmp_path: Path) -> None:
    """`run --job-dir .` in a project, then `prune --yes`, deleted the project: the script
    and the notes beside the job's files. Now `run` warns, and `prune` deletes only what
    trainguard wrote there."""
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text("print('step 1', flush=True)\n")
    (proj / "notes.txt").write_text("mine\n")
    (proj / "checkpoints").mkdir()  # the project's own, where trainguard's would go
    (proj / "checkpoints" / "my_model.pt").write_text("weights\n")
    (proj / "logs").mkdir()
    (proj / "logs" / "events.tfevents").write_text("tb\n")
    (proj / "empty").mkdir()
    r = tg("run", "--nproc-per-node", "1", "--job-dir", ".", "train.py", cwd=proj)
    assert r.returncode == 0, r.stderr
    assert "trainguard run: warning: --job-dir" in r.stderr
    assert "(checkpoints/, logs/, notes.txt and 1 more)" in r.stderr, r.stderr
    assert (proj / "trainguard.db").is_file() and (proj / "logs" / "attempt-0").is_dir()
    listed = tg("prune", str(tmp_path), "--older-than", "0", cwd=tmp_path).stdout
    assert f"would delete trainguard's files in {proj} (succeeded" in listed, listed
    assert ("would keep what trainguard did not write there: empty, notes.txt, train.py, "
            "logs/events.tfevents, checkpoints/my_model.pt") in listed, listed
    r = tg("prune", str(tmp_path), "--older-than", "0", "--yes", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    left = sorted(str(p.relative_to(proj)) for p in proj.rglob("*"))
    assert left == ["checkpoints", "checkpoints/my_model.pt", "empty", "logs",
                    "logs/events.tfevents", "notes.txt", "train.py"], left
    assert (proj / "notes.txt").read_text() == "mine\n"


def test_prune_deletes_a_job_dir_of_its_own_whole(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text("print('step 1', flush=True)\n")
    r = tg("run", "--nproc-per-node", "1", "--job-dir", "runs/a", "t.py", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "warning" not in r.stderr
    # a log dir of another name inside the job dir is the job's too
    r = tg("run", "--nproc-per-node", "1", "--job-dir", "runs/b", "--log-dir", "runs/b/mylogs",
           "t.py", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "runs" / "b" / "mylogs" / "attempt-0").is_dir()
    r = tg("prune", "runs", "--older-than", "0", "--yes", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "keep" not in r.stdout, r.stdout
    assert not (tmp_path / "runs" / "a").exists() and not (tmp_path / "runs" / "b").exists()
    assert (tmp_path / "t.py").is_file()


def test_a_relaunch_with_other_settings_says_what_changed(tmp_path: Path) -> None:
    """Running a job dir again with other flags continued the job without a word (a 2-rank
    checkpoint into 1 rank, restarts turned off by dropping --scenario)."""
    (tmp_path / "t.py").write_text("print('step 1', flush=True)\n")
    r = tg("run", "--nproc-per-node", "2", "--scenario", "single-node", "--job-dir", "j", "t.py",
           cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = tg("run", "--nproc-per-node", "2", "--scenario", "single-node", "--job-dir", "j", "t.py",
           cwd=tmp_path)  # the same command: no warning
    assert r.returncode == 0, r.stderr
    assert "SettingsChanged" not in r.stdout + r.stderr
    r = tg("run", "--nproc-per-node", "1", "--job-dir", "j", "t.py", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in (r.stdout + r.stderr).splitlines() if "SettingsChanged" in ln)
    assert "Warning SettingsChanged" in line
    assert "--nproc-per-node 2 -> 1" in line and "--scenario single-node -> none" in line
    assert "--max-restarts 3 -> 0" in line
    # walk-through 39 #4: another world size reads the saved data position anew
    assert "with the world size changed (2 -> 1 ranks), the data position a checkpoint " \
        "saved" in line and "the resume is not exact" in line
    events = json.loads(tg("events", "j", "--json", cwd=tmp_path).stdout)
    changed = next(e for e in events if e["reason"] == "SettingsChanged")["data"]["changed"]
    assert changed["nproc_per_node"] == {"before": 2, "after": 1}


def test_settings_changes_leaves_out_what_differs_per_launch() -> None:
    from trainguard.controller.launch_settings import changes_text, settings_changes

    before = {"nproc_per_node": 2, "master_addr": "n1", "master_port": 1, "run_id": "a"}
    after = {"nproc_per_node": 2, "master_addr": "n7", "master_port": 2, "run_id": "a",
             "new_key": 1}
    assert settings_changes(before, after) == {}
    assert settings_changes(None, after) == {}
    assert settings_changes(before, after | {"nproc_per_node": 4}) == {"nproc_per_node": (2, 4)}
    # a moved job dir, a script typed from another directory: nothing changed
    moved = ({"job_dir": "/a/j", "log_dir": "/a/j/logs", "checkpoint_dir": "s3://b/c",
              "entrypoint": "t.py", "entrypoint_path": "/p/t.py"},
             {"job_dir": "/b/j", "log_dir": "/b/j/logs", "checkpoint_dir": "s3://b/c",
              "entrypoint": "../t.py", "entrypoint_path": "/p/t.py"})
    assert settings_changes(*moved) == {}
    assert settings_changes(moved[0], moved[1] | {"log_dir": "/elsewhere"}) == {
        "log_dir": ("/a/j/logs", "/elsewhere")}
    # a switch reads on/off by the setting's words (its flag may be the --no- one)
    assert changes_text({"standby_workers": (False, True), "nproc_per_node": (2, 1),
                         "scenario": ("llm", None)}) == (
        "standby workers off -> on, --nproc-per-node 2 -> 1, --scenario llm -> none")
    from trainguard.controller.launch_settings import resume_caveat

    assert resume_caveat({"max_restarts": (3, 0)}, {}, {}) == ""
    # review 47 #8: 2 nodes x 4 -> 4 x 2 is the same world
    same = ({"nnodes": 2, "nproc_per_node": 4}, {"nnodes": 4, "nproc_per_node": 2})
    assert resume_caveat({"nnodes": (2, 4), "nproc_per_node": (4, 2)}, *same) == ""
    assert resume_caveat({"nnodes": (2, 1), "args": (["--bs", "8"], ["--bs", "16"])},
                         {"nnodes": 2}, {"nnodes": 1, "args": ["--bs", "16"]}) == (
        "; with the world size changed (2 -> 1 ranks), the data position a checkpoint saved "
        "(the batches consumed, a sampler's place) is read for the new one: the resume is not "
        "exact; with the script's arguments changed, the resume is not exact if one of them "
        "moves the data (a batch size, a seed)")


def test_a_mistyped_fault_variable_is_refused_before_any_rank_starts(tmp_path: Path) -> None:
    """`TRAINGUARD_FAULT=sigkill@step=15` started the job; every rank died of a 30-line
    FaultSpecError traceback, diagnosed as a bug in the training script."""
    import os

    (tmp_path / "t.py").write_text("print('step 1', flush=True)\n")
    for value, words in (("sigkill@step=15", "unknown fault kind 'sigkill'"),
                         ("exit@step=2", "'exit' needs an argument")):
        r = tg("run", "--nproc-per-node", "1", "--job-dir", "j", "t.py", cwd=tmp_path,
               env={**os.environ, "TRAINGUARD_FAULT": value})
        assert r.returncode == 2, r.stdout + r.stderr
        assert r.stderr.startswith(f"trainguard run: error: TRAINGUARD_FAULT: {value!r}: "
                                   f"{words}"), r.stderr
        assert "Fix: " in r.stderr and "Traceback" not in r.stderr
        assert not (tmp_path / "j").exists()
    r = tg("run", "--nproc-per-node", "1", "--job-dir", "j", "t.py", cwd=tmp_path,
           env={**os.environ, "TRAINGUARD_FAULT": "log:hello@step=1"})
    assert r.returncode == 0, r.stderr


def test_no_progress_says_where_the_attempts_got_stuck(tmp_path: Path) -> None:
    """Every attempt ran steps 1-10 and failed; 'made no progress' read as wrong. The event
    now says no attempt got beyond step 10 and none saved a checkpoint to resume from."""
    (tmp_path / "r.py").write_text("for s in range(1, 11):\n    print(f'step {s}', flush=True)\n"
                                   "raise RuntimeError('boom')\n")
    r = tg("run", "--nproc-per-node", "1", "--job-dir", "j", "--max-restarts", "5",
           "--unconditional-restart", "--restart-backoff", "0.1", "r.py", cwd=tmp_path)
    assert r.returncode == 86, r.stdout + r.stderr
    events = json.loads(tg("events", "j", "--json", "--reason", "NoProgress",
                           cwd=tmp_path).stdout)
    assert events[0]["message"] == (
        "giving up: 3 runs in a row (attempts or in-process restarts) made no progress "
        "(limit 3): no attempt got beyond "
        "step 10, and none committed a checkpoint trainguard saw, so each started over from "
        "the beginning, unless the script resumes from checkpoints of its own (save "
        "checkpoints to resume past the failure, or fix what fails there)")


def test_stuck_names_the_checkpoint_when_there_is_one() -> None:
    from trainguard.controller.high_water import HighWater

    marks = HighWater(max_step=40, max_committed=30)  # (a relaunch starts from the store's)
    assert marks.stuck() == ("no attempt got beyond step 40 or committed a checkpoint beyond "
                             "step 30")
    stuck = HighWater().stuck()
    assert stuck.startswith("no attempt reported a step and none committed"), stuck
    # walk-through 28: a script with steps and checkpoints of its own format got further each
    # attempt and was given up with 86: the fix names --step-pattern
    assert "--step-pattern" in stuck and "trainguard.progress(step)" in stuck


def test_read_commands_take_a_run_id_or_default_to_the_last_job(tmp_path: Path) -> None:
    """`status tg-01122b25` (the RUN ID `ls` shows) said no job there, and `status` alone
    was an error; `stop` still needs its job named."""
    r = tg("status", cwd=tmp_path)
    assert r.returncode == 2
    assert "no JOB_DIR given, and no job under ./trainguard-runs to default to" in r.stderr
    (tmp_path / "t.py").write_text("print('step 1', flush=True)\n")
    ids = []
    for _ in range(2):
        r = tg("run", "--nproc-per-node", "1", "t.py", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        ids.append(next(ln for ln in (r.stdout + r.stderr).splitlines()
                        if "JobCreated" in ln).split()[5])
    first = json.loads(tg("status", ids[0], "--json", cwd=tmp_path).stdout)
    assert first["run_id"] == ids[0]
    r = tg("status", "--json", cwd=tmp_path)
    assert json.loads(r.stdout)["run_id"] == ids[1]
    assert r.stderr.startswith(f"trainguard status: note: no JOB_DIR given: trainguard-runs/"
                               f"{ids[1]}, the job under ./trainguard-runs that changed last")
    assert tg("events", cwd=tmp_path).returncode == 0
    stop = tg("stop", cwd=tmp_path)
    assert stop.returncode == 2 and "required: JOB_DIR" in stop.stderr
    assert "2 jobs ended more than 0 days ago" in tg("prune", "--older-than", "0",
                                                     cwd=tmp_path).stdout


def test_a_run_flag_after_the_script_gets_a_note(tmp_path: Path) -> None:
    """`run --job-dir j train.py 3 --nproc-per-node 2` ran 1 worker without a hint (the flag
    went to the script, as torchrun does)."""
    (tmp_path / "t.py").write_text("import sys\nprint('step 1', sys.argv[1:], flush=True)\n")
    r = tg("run", "--job-dir", "j", "t.py", "3", "--nproc-per-node", "2", "--config", "c.yaml",
           cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert ("trainguard run: note: --nproc-per-node came after the training script, so the "
            "script gets it, not trainguard") in r.stderr
    notes = [ln for ln in r.stderr.splitlines() if ln.startswith("trainguard run:")]
    assert len(notes) == 1 and "--config" not in notes[0]  # a script's own --config: no note
    assert "['3', '--nproc-per-node', '2', '--config', 'c.yaml']" in r.stdout + r.stderr


def test_a_second_ctrl_c_ends_the_grace_period(tmp_path: Path) -> None:
    """A rank that ignores SIGTERM kept the job 15 s after a second Ctrl-C; the second one
    now SIGKILLs what is left."""
    import os
    import signal
    import subprocess
    import time

    from tests.unit.helpers import TG

    (tmp_path / "t.py").write_text(
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "for s in range(1, 10**6):\n    print(f'step {s}', flush=True)\n    time.sleep(0.2)\n")
    proc = subprocess.Popen([*TG, "run", "--nproc-per-node", "1", "--job-dir", "j",
                             "--grace-period", "60", "--no-standby-workers", "t.py"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout is not None
    for line in proc.stdout:  # until the rank runs
        if "step 3" in line:
            break
    proc.send_signal(signal.SIGINT)
    for line in proc.stdout:  # the first stop is handled (not merged with the second)
        if "stop requested" in line:
            break
    time.sleep(1.2)  # (a repeat within 1 s is the same stop delivered twice)
    assert proc.poll() is None  # the rank ignores SIGTERM: the grace period runs
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert time.monotonic() - t0 < 10, "the second Ctrl-C did not end the 60 s grace period"
    assert proc.returncode == 128 + signal.SIGINT, out
    assert "did not and got SIGKILL (a second signal cut the grace period short)" in out, out


def test_sizes_read_in_the_unit_people_read() -> None:
    from trainguard.records import size_text

    assert [size_text(n) for n in (512, 1023, 1024, 2**20 - 1, 2**20, int(2**20 * 0.4))] == [
        "512 B", "1023 B", "1.0 KiB", "1.0 MiB", "1.0 MiB", "409.6 KiB"]


def test_prune_leaves_no_empty_dir_of_its_own_in_a_shared_job_dir(tmp_path: Path) -> None:
    """Walk-through 30: the empty `checkpoints/` `run` made beside the user's files stayed."""
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text("print('step 1', flush=True)\n")
    r = tg("run", "--nproc-per-node", "1", "--job-dir", ".", "train.py", cwd=proj)
    assert r.returncode == 0, r.stderr
    assert (proj / "checkpoints").is_dir()
    r = tg("prune", str(tmp_path), "--older-than", "0", "--yes", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in proj.iterdir()) == ["train.py"]
