"""The read commands against a real job store in tmp_path."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from trainguard.cli.read import add_read_commands
from trainguard.controller.store import JobStore, WorkerRow
from trainguard.records import (
    Event,
    FaultScenario,
    Involved,
    Level,
    RecoverRecord,
    RecoverResult,
    RunningRecord,
    StartType,
    iso,
)

T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=timezone.utc)
REASONS = ["JobCreated", "JobRunning", "WorkerFailed", "RestartScheduled", "JobSucceeded"]
EVENT_KEYS = {"time", "level", "reason", "message", "involved"}
RANK_KEYS = {"rank", "local_rank", "node", "pid", "state", "exit_code", "signal", "start_count",
             "hung"}


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def ev(reason: str, seconds: float, rank: int | None = None, attempt: int | None = None) -> Event:
    level = Level.ERROR if reason == "WorkerFailed" else Level.INFO
    return Event(
        at(seconds), level, reason, f"{reason} message.", Involved("run-1", None, rank, attempt)
    )


def recover_record() -> RecoverRecord:
    return RecoverRecord(
        attempt=0,
        recover_start_at=at(100),
        fault_scenario=FaultScenario.JOB_FAILED,
        reason="rank 1 exited with code 1",
        related_task="rank 1",
        recover_result=RecoverResult.SUCCESS,
        recover_end_at=at(115),
        fault_at=at(100),
        detected_at=at(101),
        workers_stopped_at=at(102.5),
        decided_at=at(103),
        workers_started_at=at(105),
        first_progress_at=at(115),
        last_step_before=120,
        resumed_step=100,
        steps_lost=20,
    )


def workers(attempt: int) -> list[WorkerRow]:
    return [
        WorkerRow(attempt, 0, 0, "node0", 4100, "succeeded", 0, None, at(105), at(300), 2),
        WorkerRow(attempt, 1, 1, "node0", 4101, "failed", -9, "SIGKILL", at(105), at(300), 2),
    ]


@pytest.fixture
def job(tmp_path: Path) -> Path:
    """A finished job: one failure of rank 1, one restart, then success."""
    job_dir = tmp_path / "job"
    with JobStore.create(job_dir, "run-1") as s:
        for i, reason in enumerate(REASONS):
            s.add_event(ev(reason, i * 50, rank=1 if reason == "WorkerFailed" else None, attempt=0))
        first = RunningRecord(0, at(0), StartType.FIRST_START, at(100), "WorkerFailed", "rank 1")
        first.recover_records.append(recover_record())
        s.put_running(first)
        s.put_running(RunningRecord(1, at(105), StartType.AUTO_RESTART, at(300), "JobSucceeded"))
        s.put_workers(1, workers(1))
        # steps 1..120 every 0.75 s from 10 s; after the restart 101..500 every 0.45 s from 115 s
        s.add_progress([(0, k, at(10 + (k - 1) * 0.75).timestamp()) for k in range(1, 121)]
                       + [(1, k, at(115 + (k - 101) * 0.45).timestamp())
                          for k in range(101, 501)])
        s.set_meta(
            state="succeeded",
            attempt=1,
            restarts_used=1,
            max_restarts=3,
            created_at=iso(at(0)),
            ended_at=iso(at(300)),
            last_step=500,
            last_progress_at=iso(at(299)),
            job_dir=str(job_dir),
        )
    return job_dir


def run(*argv: str) -> int:
    from trainguard.cli.report import add_report_commands

    parser = argparse.ArgumentParser(prog="trainguard")
    sub = parser.add_subparsers(dest="command", required=True)
    add_read_commands(sub)
    add_report_commands(sub)
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


def test_events_json_is_an_array_of_objects_with_the_event_keys(
    job: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("events", str(job), "--json") == 0
    events = json.loads(capsys.readouterr().out)
    assert [e["reason"] for e in events] == REASONS
    assert all(set(e) == EVENT_KEYS for e in events)
    failed = events[2]
    assert failed["level"] == "Error"
    assert failed["involved"] == {"job": "run-1", "rank": 1, "attempt": 0}
    assert datetime.fromisoformat(failed["time"]) == at(100)
    assert datetime.fromisoformat(failed["time"]).tzinfo is not None


def test_events_table_shows_every_reason_and_who_was_involved(
    job: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("events", str(job)) == 0
    out = capsys.readouterr().out
    for reason in REASONS:
        assert reason in out
    assert "rank 1 · attempt 0" in out
    assert "WorkerFailed message." in out


def test_recovery_json_has_the_records_and_a_summary(
    job: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("recovery", str(job), "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"run_id", "state", "running_records", "summary"}
    assert (doc["run_id"], doc["state"]) == ("run-1", "succeeded")
    assert [r["attempt"] for r in doc["running_records"]] == [0, 1]
    rr = doc["running_records"][0]["recover_records"][0]
    assert rr["durations_s"] == {
        "detect": 1.0,
        "stop": 1.5,
        "decide": 0.5,
        "start": 2.0,
        "resume": 10.0,
        "total": 15.0,
    }
    summary = doc["summary"]
    badput = summary.pop("badput_s")
    assert summary == {
        "attempts": 2,
        "restarts": 1,
        "restarts_by_rung": {"process_restart": 1},
        "launches": 1,
        "incidents": 1,
        "steps_lost": 20,
        "steps_lost_unknown": 0,
        "steps_done_again": 20,
        "wall_s": 300.0,
        "productive_s": 253.8,
        "goodput": 0.846,
    }
    # start-up to step 1; steps 101..120 done again (20 x 0.75 s) and the step the crash cut
    # short; fault -> detected; detected -> first step after the restart; after the last step
    assert badput == {"startup": 10.0, "checkpoint_blocking": 0.0, "wasted_progress": 15.75,
                      "detection": 1.0, "recovery": 14.0, "hang": 0.0, "queued": 0.0,
                      "other": 5.45}


def test_recovery_text_shows_each_attempt_its_incident_and_the_summary(
    job: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("recovery", str(job)) == 0
    out = capsys.readouterr().out
    assert "attempt 0  first_start" in out and "attempt 1  auto_restart" in out
    assert "ended: WorkerFailed (rank 1)" in out
    assert ("job_failed · process_restart · success · rank 1 exited with code 1 "
            "(related: rank 1)") in out
    split = {"detect": 1, "stop": 1.5, "decide": 0.5, "start": 2, "resume": 10, "total": 15}
    for phase, seconds in split.items():
        assert f"{phase} {seconds:.3f}s" in out
    assert "steps lost 20" in out
    assert "goodput 84.6%" in out
    assert "wasted_progress 15.750s" in out


def test_status_json_has_the_exact_keys_and_one_entry_per_rank(
    job: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("status", str(job), "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {
        "run_id",
        "state",
        "attempt",
        "restarts_used",
        "max_restarts",
        "last_progress",
        "training",
        "ranks",
        "job_dir",
        "recorded_job_dir",
        "store_free_bytes",
        "store_disk_full",
        "agents_without_controller", "agents_unknown",
        "nodes",
        "node_usage",
        "connections_refused", "worker_messages_refused",
        "restarts",
        "restarts_by_rung", "ended_by",
        "budgets", "budgets_off",
        "hang", "stopping", "exit_code",
        "launcher",
    }
    assert doc["nodes"] == []  # a single-node job keeps no node rows
    assert doc["node_usage"] == []  # none recorded (a job that ended has none)
    assert (doc["restarts"], doc["restarts_by_rung"]) == (1, {"process_restart": 1})
    assert doc["budgets"]["restarts"] == {"used": 1, "max": 3}
    assert doc["budgets_off"] == []  # a store from before the rungs in use were recorded
    assert doc["hang"] is None and doc["launcher"] == {"pid": None, "host": None,
                                                       "alive": None}
    assert (doc["state"], doc["attempt"], doc["restarts_used"], doc["max_restarts"]) == (
        "succeeded",
        1,
        1,
        3,
    )
    assert doc["last_progress"] == {"step": 500, "time": iso(at(299)), "source": "step"}
    assert doc["training"] == []  # the script logged none
    assert all(set(r) == RANK_KEYS for r in doc["ranks"])
    assert doc["ranks"][1] == {
        "rank": 1,
        "local_rank": 1,
        "node": "node0",
        "pid": 4101,
        "state": "failed",
        "exit_code": -9,
        "signal": "SIGKILL",
        "start_count": 2,
        "hung": False,
    }
    assert doc["job_dir"] == str(job)


def test_status_text_shows_the_header_and_each_rank(
    job: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("status", str(job)) == 0
    out = capsys.readouterr().out
    assert "run run-1 · succeeded · attempt 1 · 1 recovery (1 process restart)" in out
    assert "budgets: restarts 1/3  hang_restarts_in_a_row 0/-" in out
    assert "step 500" in out
    assert "SIGKILL" in out and "failed" in out and "4101" in out
    (row,) = [line.split() for line in out.splitlines() if "4101" in line]
    assert row[4:7] == ["failed", "-", "SIGKILL"]  # no -9 beside its signal


@pytest.mark.parametrize("command", ["events", "recovery", "status"])
@pytest.mark.parametrize("as_json", [False, True])
def test_a_missing_job_dir_exits_2_with_one_clear_line(
    command: str, as_json: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [command, str(tmp_path / "nope")] + (["--json"] if as_json else [])
    assert run(*argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert captured.err.startswith(f"trainguard {command}: error: no trainguard job at ")
    assert "pass the job dir printed by `trainguard run`" in captured.err


def test_an_unreadable_store_exits_2_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "trainguard.db").write_bytes(b"not a database " * 200)
    assert run("status", str(tmp_path)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "trainguard.db" in err


@pytest.mark.timeout(30)
def test_events_follow_returns_once_the_job_has_finished(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job_dir = tmp_path / "job"
    JobStore.create(job_dir, "run-1").close()

    def controller() -> None:
        with JobStore.create(job_dir, "run-1") as s:
            s.set_meta(state="running")
            for i, reason in enumerate(REASONS):
                time.sleep(0.2)
                if reason == "JobSucceeded":
                    s.set_meta(state="succeeded")  # state first, then the last event
                s.add_event(ev(reason, i))

    writer = threading.Thread(target=controller)
    writer.start()
    started = time.monotonic()
    code = run("events", str(job_dir), "--follow", "--json")
    writer.join()
    assert code == 0
    assert time.monotonic() - started < 10
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(line)["reason"] for line in lines] == REASONS


@pytest.mark.timeout(30)
def test_events_follow_on_a_finished_job_prints_everything_and_returns(
    job: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("events", str(job), "-f") == 0
    out = capsys.readouterr().out
    assert [r for r in REASONS if r in out] == REASONS
    assert "rank 1 · attempt 0" in out
    header, first = out.splitlines()[:2]  # a header, as `events` has, in the same columns
    assert header.split() == ["TIME", "LEVEL", "REASON", "INVOLVED", "MESSAGE"]
    assert header.index("REASON") == first.index(REASONS[0])


def test_a_job_whose_launcher_died_reads_lost_and_its_wall_time_ends_at_its_last_sign(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    job_dir = tmp_path / "lost"
    with JobStore.create(job_dir, "run-2") as s:
        s.put_running(RunningRecord(0, at(0), StartType.FIRST_START))
        s.add_progress([(0, k, at(10 + k).timestamp()) for k in range(1, 31)])
        s.set_meta(state="running", attempt=0, created_at=iso(at(0)), launcher_pid=dead.pid,
                   launcher_host=socket.gethostname(), last_step=30,
                   last_progress_at=iso(at(40)))
    assert run("recovery", str(job_dir)) == 0
    out = capsys.readouterr().out
    assert "run run-2 · lost" in out and "→ lost (its launcher died)" in out
    assert run("recovery", str(job_dir), "--json") == 0
    summary = json.loads(capsys.readouterr().out)["summary"]
    assert summary["wall_s"] == 40.0  # to the last step, not to now
    assert summary["badput_s"]["startup"] == 11.0


def test_status_shows_a_confirmed_hang_left_running_and_the_launcher_to_stop(
    job: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with JobStore.create(job, "run-1") as s:
        s.set_meta(state="running", ended_at=None, launcher_pid=os.getpid(),
                   launcher_host=socket.gethostname())
        s.put_workers(1, [WorkerRow(1, r, r, "node0", 4100 + r, "running", None, None, at(105),
                                    None, 2) for r in (0, 1)])
        s.add_event(Event(at(290), Level.WARNING, "HangConfirmed", "hang confirmed",
                          Involved("run-1", None, 1, 1),
                          {"stuck_ranks": [0, 1], "culprit": {"rank": 1, "reason": "Rank 1 "
                                                               "is sleeping"}}))
    assert run("status", str(job)) == 0
    out = capsys.readouterr().out
    assert "running · HUNG (confirmed, left running)" in out
    assert "culprit: Rank 1 is sleeping" in out
    assert out.count("running (hung)") == 2, out  # each stuck rank's row (walk-through 9)
    assert run("status", str(job), "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["hung"] for r in doc["ranks"]] == [True, True]  # and in JSON (walk-through 10)
    assert f"launcher: pid {os.getpid()}" in out and "trainguard stop" in out
    with JobStore.create(job, "run-1") as s:
        s.add_event(Event(at(295), Level.INFO, "HangCleared", "progress again",
                          Involved("run-1", None, None, 1)))
    assert run("status", str(job), "--json") == 0
    assert json.loads(capsys.readouterr().out)["hang"] is None


def test_a_hang_restarted_in_process_is_not_left_running(
    job: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Walk-through 27: an in-process restart upon suspension goes on in the same attempt;
    status read 'HUNG (confirmed, left running)' (and trainguard_job_hung 1) while the job
    trained on, naming the replaced rank's old pid to `kill -CONT`."""
    with JobStore.create(job, "run-1") as s:
        s.set_meta(state="running", ended_at=None, attempt=0, launcher_pid=os.getpid(),
                   launcher_host=socket.gethostname())
        s.add_event(Event(at(290), Level.WARNING, "HangConfirmed", "hang confirmed",
                          Involved("run-1", None, None, 0),
                          {"stuck_ranks": [0, 1], "culprit": {"rank": 1}}))
        s.add_event(Event(at(292), Level.WARNING, "InProcessRestarting", "rank 1 starts again",
                          Involved("run-1", None, None, 0)))
    assert run("status", str(job), "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["hang"] is None
    assert run("metrics", str(job)) == 0
    assert "trainguard_job_hung 0.0" in capsys.readouterr().out


def test_events_are_listed_in_time_order(
    job: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Walk-through 42 #9: a takeover records what the ranks kept while no controller
    watched (a checkpoint committed meanwhile) with its own, earlier time; `events` listed it
    after the ControllerRestarted that came later."""
    with JobStore.create(job, "run-1") as s:
        s.add_event(ev("CheckpointSaved", 75, attempt=0))  # recorded last, happened earlier
    assert run("events", str(job), "--json") == 0
    got = json.loads(capsys.readouterr().out)
    times = [e["time"] for e in got]
    assert times == sorted(times) and "CheckpointSaved" in [e["reason"] for e in got]
    assert run("events", str(job), "--json", "--tail", "1") == 0
    assert [e["reason"] for e in json.loads(capsys.readouterr().out)] == ["JobSucceeded"]


def test_events_filter_by_level_reason_attempt_and_tail(
    job: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def shown(*flags: str) -> list[str]:
        assert run("events", str(job), "--json", *flags) == 0
        return [e["reason"] for e in json.loads(capsys.readouterr().out)]

    assert shown("--level", "error") == ["WorkerFailed"]
    assert shown("--reason", "JobCreated,JobSucceeded") == ["JobCreated", "JobSucceeded"]
    assert shown("--reason", "JobRunning", "--reason", "JobCreated") == ["JobCreated",
                                                                         "JobRunning"]
    assert shown("--attempt", "0", "--tail", "2") == ["RestartScheduled", "JobSucceeded"]
    assert shown("--tail", "0") == []


def test_tables_end_without_trailing_blanks_and_fit_columns_in_a_pipe(
    job: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    for command in ("events", "status"):
        assert run(command, str(job)) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines and all(line == line.rstrip() for line in lines)
        table = lines[lines.index(next(x for x in lines if x.startswith(("TIME", "RANK")))):]
        assert max(len(line) for line in table) <= 80, command


def test_a_fault_one_rung_handed_to_the_next_is_one_incident(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Walk-through 12: one crash under step re-execution read `2 incidents` (the step
    re-execution's `downgrade` record, then the process restart's)."""
    from dataclasses import replace

    job_dir = tmp_path / "job"
    with JobStore.create(job_dir, "run-1") as s:
        first = RunningRecord(0, at(0), StartType.FIRST_START, at(100), "WorkerFailed", "rank 1")
        handed = replace(recover_record(), recover="step_reexecution",
                         recover_result=RecoverResult.DOWNGRADE, steps_lost=None,
                         first_progress_at=None)
        first.recover_records += [handed, recover_record()]
        s.put_running(first)
        s.put_running(RunningRecord(1, at(105), StartType.AUTO_RESTART, at(300), "JobSucceeded"))
        s.set_meta(state="succeeded", attempt=1)
    assert run("recovery", str(job_dir), "--json") == 0
    summary = json.loads(capsys.readouterr().out)["summary"]
    assert summary["incidents"] == 1 and summary["steps_lost"] == 20, summary
    # report lists that one incident, not the rung that handed it on (walk-through 13: the
    # step re-execution's record showed the user's crash as nccl_communication_error)
    assert run("report", str(job_dir), "--json") == 0
    incidents = json.loads(capsys.readouterr().out)["incidents"]
    assert [i["recover"] for i in incidents] == ["process_restart"], incidents


def test_report_shows_an_unknown_steps_lost_as_a_dash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Walk-through 13: `steps lost None` (Python's None) for a restart of a job without step
    reports."""
    from dataclasses import replace

    job_dir = tmp_path / "job"
    with JobStore.create(job_dir, "run-1") as s:
        first = RunningRecord(0, at(0), StartType.FIRST_START, at(100), "WorkerFailed", "rank 1")
        first.recover_records.append(replace(recover_record(), steps_lost=None,
                                             first_progress_at=None))
        s.put_running(first)
        s.set_meta(state="running", attempt=1)
    assert run("report", str(job_dir)) == 0
    out = capsys.readouterr().out
    assert "steps lost -" in out and "None" not in out, out
    # walk-through 36 #2: the summary said "steps lost in incidents 0"
    assert run("recovery", str(job_dir)) == 0
    out = capsys.readouterr().out
    assert "steps lost in incidents 0 (unknown in 1), " in out, out

