"""`trainguard diagnose JOB_DIR` on the store a node-loss job leaves (as a real 2-node job
with a spare writes it: tests/integration/test_multinode_local.py runs one): the attempt the
loss ended is picked, and the lost node is blamed, not a rank on a healthy node."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from trainguard.cli import main
from trainguard.controller.store import JobStore, WorkerRow
from trainguard.records import FaultScenario, RecoverRecord, RunningRecord, StartType
from trainguard.states import WorkerState

T0 = datetime(2026, 12, 2, 7, 7, tzinfo=timezone.utc)
REASON = ("node-1 was lost (its agent process ended): its ranks move to spare node-2; the "
          "other nodes restart their processes in place")


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def node_loss_job(tmp_path: Path, healthy_rank_failed: bool) -> Path:
    """2 nodes x 1 rank and a spare; node-1 lost in attempt 0; attempt 1 succeeded. With
    `healthy_rank_failed`, rank 0 (node-0) died of the broken connection first."""
    job = tmp_path / "job"
    with JobStore.create(job, "nl") as store:
        store.set_meta(log_dir=str(job / "logs"), attempt=1, state="succeeded")
        rr = RecoverRecord(0, at(12), FaultScenario.NODE_FAULT, REASON, "node/node-1",
                           recover="pod_reschedule")
        store.put_running(RunningRecord(0, at(0), StartType.FIRST_START, end_at=at(12),
                                        end_reason=f"node node-1: {REASON}",
                                        end_related_task="node/node-1",
                                        end_recover="pod_reschedule", recover_records=[rr]))
        store.put_running(RunningRecord(1, at(12), StartType.POD_RESCHEDULE, end_at=at(24),
                                        end_reason="succeeded"))
        rank0 = (WorkerRow(0, 0, 0, "node-0", 100, WorkerState.FAILED, 1, ended_at=at(11.9))
                 if healthy_rank_failed else
                 WorkerRow(0, 0, 0, "node-0", 100, WorkerState.STOPPED, -15, "SIGTERM"))
        store.put_workers(0, [rank0, WorkerRow(0, 1, 0, "node-1", 101, WorkerState.RUNNING)])
        store.put_workers(1, [WorkerRow(1, r, 0, n, 200 + r, WorkerState.SUCCEEDED, 0)
                              for r, n in ((0, "node-0"), (1, "node-2"))])
    gloo = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection "
            "closed by peer [127.0.0.1]:29500")
    logs = {0: ["step 25", "Traceback (most recent call last):",
                '  File "train.py", line 9, in <module>', gloo] if healthy_rank_failed
            else ["step 25"], 1: ["step 25"]}
    for attempt in (0, 1):
        d = job / "logs" / f"attempt-{attempt}"
        d.mkdir(parents=True)
        for rank in (0, 1):
            lines = logs[rank] if attempt == 0 else ["step 60", "done"]
            (d / f"rank-{rank}.log").write_text("".join(
                f"{at(11).isoformat()} err {ln}\n" for ln in lines), encoding="utf-8")
    return job


def diagnose(capsys: pytest.CaptureFixture[str], job: Path, *args: str) -> dict[str, Any]:
    assert main(["diagnose", str(job), "--json", *args]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


@pytest.mark.parametrize("healthy_rank_failed", [False, True])
def test_diagnose_a_job_dir_picks_the_attempt_a_node_loss_ended_not_the_one_that_succeeded(
    healthy_rank_failed: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = diagnose(capsys, node_loss_job(tmp_path, healthy_rank_failed))
    assert report["attempt"] == 0
    assert report["diagnosis"]["subcategory"] == "node_lost"


@pytest.mark.parametrize("healthy_rank_failed", [False, True])
def test_diagnose_the_node_loss_attempt_blames_the_lost_node_not_a_healthy_nodes_rank(
    healthy_rank_failed: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = diagnose(capsys, node_loss_job(tmp_path, healthy_rank_failed), "--attempt", "0")[
        "diagnosis"]
    assert (d["culprit"]["node"], d["culprit"]["rank"]) == ("node-1", 1)
    assert d["fault_domain"] == "infrastructure" and d["restart_helps"] == "yes"
    assert d["confidence"] >= 0.9
    assert "node-1 was lost" in d["summary"] and "node-1.agent.log" in d["advice"]
    if healthy_rank_failed:  # the healthy node's error is a consequence, shown as a symptom
        assert any("Connection closed by peer" in s["text"] for s in d["symptoms"])


def test_diagnose_the_attempt_after_the_loss_finds_no_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["diagnose", str(node_loss_job(tmp_path, False)), "--attempt", "1"]) == 1


def test_evidence_files_are_named_relative_to_the_job_dir_however_it_was_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    job = node_loss_job(tmp_path, True)
    absolute = diagnose(capsys, job, "--attempt", "0")["files"]
    monkeypatch.chdir(tmp_path)
    relative = diagnose(capsys, Path(job.name), "--attempt", "0")["files"]
    assert relative == absolute and all(f.startswith("logs/") for f in relative), relative


def test_a_job_that_ended_without_progress_is_not_told_to_restart_without_a_word(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = node_loss_job(tmp_path, True)
    with JobStore.create(job, "nl") as s:  # the writer of the job's own store
        s.set_meta(exit_code=86)
    assert main(["diagnose", str(job), "--attempt", "0"]) == 0
    err = capsys.readouterr().err
    assert "trainguard diagnose: warning: the job ended with exit 86: its attempts kept failing " \
           "without progress, so restarting did not help" in err, err


def console_evidence(console: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """`trainguard diagnose CONSOLE --json`'s evidence (a console copy of a job's output)."""
    assert main(["diagnose", str(console), "--json"]) in (0, 1)
    return json.loads(capsys.readouterr().out)["diagnosis"]["evidence"]  # type: ignore[no-any-return]


def test_a_console_copy_is_read_without_trainguards_own_conclusions(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Review 39 #7: `diagnose job.out` took a FailureDiagnosed line's words ("not by the
    kernel's OOM killer") for the evidence of an OOM; the WorkerFailed line, the one fact of
    the exit the console holds, is read."""
    console = tmp_path / "job.out"
    console.write_text(
        "[trainguard] 15:49:34 Info JobCreated: job tg-1 created: 2 worker(s)\n"
        "[rank 1] step 3\n[rank 0] step 6\n"
        "[trainguard] 15:49:34 Warning WorkerFailed: rank 1 (pid 15371) was killed by SIGKILL\n"
        "[trainguard] 15:49:34 Warning FailureDiagnosed: killed_by_signal_unknown "
        "(infrastructure, restart helps: yes): rank 1 was killed by SIGKILL, not by the "
        "kernel's OOM killer (it recorded no OOM kill). Restart\n"
        "[trainguard] 15:49:35 Info RestartScheduled: restart 1/3 after "
        "killed_by_signal_unknown; restarting in 1.0s\n")
    evidence = console_evidence(console, capsys)
    assert evidence["line"] == 4 and "WorkerFailed" in evidence["text"], evidence


def test_a_console_copy_of_a_hang_is_read_from_its_hang_confirmed_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Review 40 #2, #10: skipping every event line said "no failure found" for a hung job
    (its HangConfirmed line is the console's only record of it); trainguard's own logging
    (`[trainguard] WARNING trainguard.controller.fleet: ...`) is no fact of the ranks."""
    console = tmp_path / "job.out"
    console.write_text(
        "[rank 0] step 40\n[rank 1] step 40\n"
        "[trainguard] WARNING trainguard.controller.fleet: every node's link is down at once "
        "(a full disruption): this controller's side is suspect\n"
        "[trainguard] 16:25:19 Warning HangConfirmed: hang confirmed: no progress for 80.0s "
        "on rank(s) 0, 1 (threshold 8.0s: max(3 x p99 0.287s, floor 8s)). Culprit: rank 1: "
        "rank 1 is in the data loader while the others wait in a collective (stacks: "
        "logs/attempt-0/stacks, taken 1.2s after the hang was confirmed at 16:25:19)\n"
        "[trainguard] 16:25:19 Info RestartScheduled: restart upon suspension 1/3\n")
    evidence = console_evidence(console, capsys)
    assert evidence["line"] == 4 and "HangConfirmed" in evidence["text"], evidence


def test_a_console_copy_s_job_failed_line_is_no_symptom_of_the_rank_it_names(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Walk-through 37 #4: the launcher's JobFailed line, which repeats its verdict, was
    listed as a symptom printed by the rank it names."""
    console = tmp_path / "job.out"
    console.write_text(
        "[rank 1] Traceback (most recent call last):\n"
        '[rank 1]   File "train.py", line 9, in <module>\n'
        "[rank 1] RuntimeError: injected crash at step 12\n"
        "[trainguard] 19:11:03 Warning WorkerFailed: rank 1 (pid 4242) exited with code 1\n"
        "[trainguard] 19:11:03 Error JobFailed: job failed: rank 1: RuntimeError: injected "
        "crash at step 12; not restarted: user_code_error in the user_code domain\n")
    assert main(["diagnose", str(console), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)["diagnosis"]
    texts = [doc["evidence"]["text"], *(s["text"] for s in doc.get("symptoms", []))]
    assert doc["evidence"]["line"] == 3 and not any("JobFailed" in t for t in texts), doc


def test_a_console_copy_s_launcher_warning_is_the_rank_it_names_not_the_one_before(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Review 43 #6: a launcher Warning line (CheckpointSaveFailed) was thought read as the
    output of the rank that printed before it; it is the fact of the rank its text names,
    and of no rank when it names none."""
    for named, rank in (("rank 1: ", 1), ("", None)):
        console = tmp_path / f"job{rank}.out"
        console.write_text(
            "[rank 1] step 10 loss 1.0\n[rank 0] step 11 loss 1.0\n"
            f"[trainguard] 19:16:40 Warning CheckpointSaveFailed: {named}checkpoint of step 30 "
            "failed: OSError: [Errno 28] No space left on device\n")
        assert main(["diagnose", str(console), "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)["diagnosis"]
        assert doc["category"] == "disk_full_or_storage_io", doc
        assert (doc["evidence"]["line"], doc["evidence"].get("rank")) == (3, rank), doc
