"""Hugging Face Trainer under trainguard: a 2-rank CPU (gloo) run of a tiny GPT-2, rank 1
SIGKILLed mid-epoch after leaving a half-written checkpoint directory behind, restarted by
trainguard, ends with the same loss sequence and final weights as an uninterrupted run —
with the one-line integration, and with the unmodified script under `--auto-resume hf`, which
is then also stopped (`trainguard stop`: the ranks drain) and run again to the end."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import (
    ROOT,
    TG,
    assert_train_metrics,
    drained_step,
    read_json,
    reasons,
    run_tg,
    trainer_result,
)

EXAMPLE = ROOT / "examples" / "hf_trainer.py"
STEPS = ["--steps", "14", "--save-every", "4"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[tuple[list[list[float]], str],
                                                                 Path]:
    """The uninterrupted run's losses and weights, and its output dir."""
    tmp = tmp_path_factory.mktemp("hf-clean")
    for run in range(2):  # the reference run, once more if torch aborted a rank at exit
        job = tmp / f"job{run}"
        r = run_tg(["run", "--nproc-per-node", "2", "--job-dir", str(job), str(EXAMPLE),
                    "--out", str(tmp / f"out{run}"), *STEPS], cwd=tmp, timeout=300)
        if r.returncode == 0 or not aborted_at_exit(job):
            break
    assert r.returncode == 0, r.stderr[-3000:]
    return trainer_result(r.stdout), tmp / f"out{run}"


@pytest.fixture(scope="module")
def uninterrupted(reference: tuple[tuple[list[list[float]], str], Path]) \
        -> tuple[list[list[float]], str]:
    return reference[0]


def aborted_at_exit(job: Path) -> bool:
    """A rank SIGABRTed by torch at interpreter exit after training ended: the Trainer leaves
    its gloo group to finalization, where gloo's worker threads sometimes abort the process
    (pytorch/pytorch#179291; now and then). Not what the tests
    check: they compare a recovered run with a clean one."""
    logs = sorted((job / "logs" / "attempt-0").glob("rank-*.log"))
    text = [p.read_text(encoding="utf-8", errors="replace") for p in logs]
    return any("terminate called without an active exception" in t for t in text) and any(
        "weights sha256" in t for t in text)


def aborted_after_drain(job: Path, rank: int) -> bool:
    """A drained rank (exit 143 on its way) SIGABRTed by torch at interpreter exit, as in
    aborted_at_exit: the drain is done, its checkpoint committed."""
    log = max((job / "logs").glob(f"attempt-*/rank-{rank}.log"),
              key=lambda p: int(p.parent.name.split("-")[1]))
    text = log.read_text(encoding="utf-8", errors="replace")
    return "exiting with 143" in text and "terminate called without an active exception" in \
        text.split("exiting with 143", 1)[1]


def test_a_rank_killed_mid_epoch_resumes_to_the_uninterrupted_losses_and_weights(
        tmp_path: Path, uninterrupted: tuple[list[list[float]], str]) -> None:
    """The one-line integration (the callback and `train`)."""
    r = run_tg(["run", "--nproc-per-node", "2", "--max-restarts", "2", "--job-dir",
                str(tmp_path / "job"), str(EXAMPLE), "--out", str(tmp_path / "out"), *STEPS,
                "--trainguard"], cwd=tmp_path, timeout=300,
               env={"EXAMPLE_KILL_AT": "6", "EXAMPLE_LEFTOVER": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert trainer_result(r.stdout) == uninterrupted
    assert_killed_and_resumed_from_4(tmp_path)
    # (walk-through 22) the loop's saves say how long they blocked it: the report sizes the
    # checkpoint interval (it said 'interval advice needs two saves in one attempt')
    advice = read_json("report", tmp_path / "job")["checkpoint_interval"]
    assert advice["current_s"] > 0 and advice["blocking_s"] > 0 and advice["optimal_s"] > 0


def test_the_unmodified_script_killed_then_stopped_resumes_each_time_exactly(
        tmp_path: Path, uninterrupted: tuple[list[list[float]], str]) -> None:
    """Under `--auto-resume hf`, one job: rank 1 is SIGKILLed after step 6 (restarted from
    checkpoint-4), then `trainguard stop` comes after step 7 of the restarted attempt: the
    ranks save at the step end they agree on and exit (the drain). The same command again
    resumes from that save and ends as the uninterrupted run; the job's metrics hold the
    loss rank 0 logged last."""
    job = tmp_path / "job"
    cmd = ["run", "--nproc-per-node", "2", "--max-restarts", "2", "--auto-resume", "hf",
           "--job-dir", str(job), str(EXAMPLE), "--out", str(tmp_path / "out"), *STEPS]
    r = run_tg(cmd, cwd=tmp_path, timeout=300,
               env={"EXAMPLE_KILL_AT": "6", "EXAMPLE_LEFTOVER": "1", "EXAMPLE_STOP_AT": "7"})
    drained = drained_step(r, job)
    assert 7 < drained < 14
    assert_killed_and_resumed_from_4(tmp_path)
    assert "[trainguard] auto-resume: " in r.stdout and "checkpoint-4" in r.stdout
    codes = [w["exit_code"] for w in read_json("status", job)["ranks"]]
    assert all(c == 143 or (c == -6 and aborted_after_drain(job, r)) for r, c in
               enumerate(codes)), codes  # (torch's abort at exit, as aborted_at_exit says)
    again = run_tg(cmd, cwd=tmp_path, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    story = [f"{e['reason']}: {e['message']}" for e in read_json("events", job)]
    at_exit = at_exit_restarts(job)
    assert reasons(job).count("WorkersRestarted") == 1 + at_exit, \
        "\n".join(story) + again.stderr[-3000:]
    assert f"[trainguard] auto-resume: {tmp_path / 'out'}/checkpoint-{drained}" in again.stdout
    losses, digest = trainer_result(again.stdout)
    assert (losses, digest) == uninterrupted
    resumed = [e for e in read_json("events", job) if e["reason"] == "Resumed"]
    assert [e["data"]["step"] for e in resumed] == [4, drained] + [14] * at_exit
    assert_train_metrics(job, losses[-1])


def test_a_rank_killed_in_a_save_with_save_total_limit_resumes_from_the_committed_one(
        tmp_path: Path, uninterrupted: tuple[list[list[float]], str]) -> None:
    """Walk-through 29: with save_total_limit=1, Trainer deleted the committed checkpoint-4
    inside checkpoint-8's save, before the commit; rank 1 killed there left only the half-written
    checkpoint-8 (no RNG state of rank 1), and the restart resumed from it, not exactly. The
    rotation now waits for the commit."""
    job = tmp_path / "job"
    r = run_tg(["run", "--nproc-per-node", "2", "--max-restarts", "2", "--auto-resume", "hf",
                "--job-dir", str(job), str(EXAMPLE), "--out", str(tmp_path / "out"), *STEPS,
                "--save-total-limit", "1"], cwd=tmp_path, timeout=300,
               env={"EXAMPLE_KILL_IN_SAVE": "8"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "[trainguard] auto-resume: " in r.stdout and f"{tmp_path / 'out'}/checkpoint-4" \
        in r.stdout, r.stdout[-3000:]
    assert trainer_result(r.stdout) == uninterrupted
    # the limit still holds once the saves are committed: the last one is left
    assert sorted(p.name for p in (tmp_path / "out").glob("checkpoint-*")) == ["checkpoint-14"]
    # `ckpt ls JOB_DIR` finds it from the job's CheckpointSaved events (walk-through 29, #8)
    ls = subprocess.run([*TG, "ckpt", "ls", str(job), "--json"], capture_output=True,
                        text=True, check=True, timeout=60)
    assert [(r["step"], r["status"]) for r in json.loads(ls.stdout)] == [(14, "valid")]


@pytest.mark.parametrize("how", [([], ["--trainguard"]), (["--auto-resume", "hf"], [])],
                         ids=["one-line", "auto-resume"])
def test_a_finished_job_run_again_trains_no_step_past_its_end(
        tmp_path: Path, reference: tuple[tuple[list[list[float]], str], Path],
        how: tuple[list[str], list[str]]) -> None:
    """What a restart after torch's abort at exit (aborted_at_exit) does to a finished job,
    and a user's second run of the command: Trainer resumed from the last checkpoint trained
    step 15 of a 14-step run (a loss the uninterrupted run never logged) and saved
    checkpoint-15. It loads the checkpoint and trains nothing."""
    out = tmp_path / "out"
    shutil.copytree(reference[1], out)
    r = run_tg(["run", "--nproc-per-node", "2", *how[0], "--job-dir", str(tmp_path / "job"),
                str(EXAMPLE), "--out", str(out), *STEPS, *how[1]], cwd=tmp_path, timeout=300)
    assert r.returncode == 0 or aborted_at_exit(tmp_path / "job"), r.stderr[-3000:]
    assert f"{out}/checkpoint-14 is at the run's last step (14): training is over" in r.stdout
    assert trainer_result(r.stdout) == reference[0]
    assert sorted(p.name for p in out.glob("checkpoint-*")) == sorted(
        p.name for p in reference[1].glob("checkpoint-*"))
    # review 34 #5, #6: the state loaded is rank 0's file, but each rank's own rank holds;
    # train()'s metrics have Trainer's keys
    for rank, zero in ((0, True), (1, False)):
        assert f"[rank {rank}] state is world process zero: {zero}" in r.stdout, r.stdout[-2000:]
    keys = re.findall(r"^\[rank 0\] train metrics (\[.*\])$", r.stdout, re.M)
    assert set(json.loads(keys[-1])) >= {"train_runtime", "train_samples_per_second",
                                         "train_steps_per_second", "total_flos", "train_loss",
                                         "epoch"}


def at_exit_restarts(job: Path) -> int:
    """How often torch's abort at interpreter exit after training ended (aborted_at_exit)
    restarted the finished job, from its last checkpoint (trained nothing since: the
    finished-run test above): not what these tests check."""
    return sum("terminate called without an active exception" in e["message"]
               for e in read_json("events", job) if e["reason"] == "FailureDiagnosed")


def assert_killed_and_resumed_from_4(tmp_path: Path) -> None:
    job = tmp_path / "job"
    assert reasons(job).count("WorkersRestarted") == 1 + at_exit_restarts(job)
    # the kill left checkpoint-1006 half written: the stock resume would have picked it
    from transformers.trainer_utils import get_last_checkpoint

    assert get_last_checkpoint(str(tmp_path / "out")).endswith("checkpoint-1006")
    rr = read_json("recovery", tmp_path / "job")["running_records"][0]["recover_records"][0]
    # from checkpoint-4; rank 1 died after step 6. Steps lost are counted from the steps
    # reported, at most one report per 0.2 s: this toy's steps take a few ms, so steps 5 and
    # 6 may not have been reported yet (at most 2, as the Lightning test says)
    assert rr["resumed_step"] == 4 and rr["steps_lost"] <= 2
    assert rr["resumed_from"] == "storage"


def test_the_example_honours_trainguard_fault_like_the_other_examples(tmp_path: Path) -> None:
    r = run_tg(["run", "--nproc-per-node", "1", "--job-dir", str(tmp_path / "job"),
                str(EXAMPLE), "--out", str(tmp_path / "out"), "--steps", "6"], cwd=tmp_path,
               fault="exit:7@step=3", timeout=300)
    assert r.returncode == 1, r.stderr[-3000:]
    rank = read_json("status", tmp_path / "job")["ranks"][0]
    assert rank["exit_code"] == 7


def tiny_trainer(out: Path, steps: int) -> Any:
    """A real Trainer in this process (one rank, CPU): examples/hf_trainer.py's model."""
    from examples.hf_trainer import SEQ, VOCAB, RandomTokens
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    args = TrainingArguments(output_dir=str(out), max_steps=steps, save_steps=2,
                             per_device_train_batch_size=2, report_to=[], use_cpu=True,
                             disable_tqdm=True, logging_steps=1, save_strategy="steps")
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=16, n_layer=1, n_head=2)
    return Trainer(model=GPT2LMHeadModel(cfg), args=args,
                   train_dataset=RandomTokens(64, seed=1))


def test_a_save_into_a_committed_dir_removes_its_old_marker_first(tmp_path: Path) -> None:
    """Walk-through 29: a resume from before a committed checkpoint-N (N skipped as damaged)
    saves into checkpoint-N again; its old marker stayed while Trainer wrote, so a save cut
    short there read as committed (new weights, the old optimizer state)."""
    from trainguard.integrations.common import COMMIT_MARKER
    from trainguard.integrations.hf import TrainguardCallback

    out = tmp_path / "out"
    stale = out / "checkpoint-2"
    stale.mkdir(parents=True)
    (stale / COMMIT_MARKER).write_text('{"step": 2, "files": {}}')
    trainer = tiny_trainer(out, 2)
    trainer.add_callback(TrainguardCallback())
    seen: list[bool] = []
    save_opt = trainer._save_optimizer_and_scheduler

    def saving(output_dir: str) -> None:  # mid-save: the weights written, not the optimizer
        seen.append((Path(output_dir) / COMMIT_MARKER).exists())
        save_opt(output_dir)

    trainer._save_optimizer_and_scheduler = saving
    trainer.train()
    assert seen == [False]  # gone before the save wrote into the dir
    assert json.loads((stale / COMMIT_MARKER).read_text())["files"]  # committed anew


def test_resume_false_on_a_restart_resumes_under_auto_resume(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Walk-through 29: `train(resume_from_checkpoint=args.resume)` with the flag left off
    passes False; under --auto-resume hf every restart began at step 0 without a word. A
    restart (attempt > 0) now resumes from the newest committed checkpoint and says so; a
    first attempt starts fresh, as the script asks, and says what it passes over."""
    from transformers import TrainerCallback

    from trainguard.integrations import hf

    class Steps(TrainerCallback):  # the steps this run trained (not the history it loaded)
        done = 0

        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            Steps.done += 1

    def launch(attempt: str, steps: int) -> str:
        """A launch of attempt `attempt` passing resume_from_checkpoint=False: its output."""
        monkeypatch.setenv("TRAINGUARD_ATTEMPT", attempt)
        trainer = tiny_trainer(out, steps)
        trainer.add_callback(Steps())
        Steps.done = 0
        trainer.train(resume_from_checkpoint=False)
        return capsys.readouterr().out

    out = tmp_path / "out"
    hf.patch()
    launch("0", 4)  # commits checkpoint-2 and checkpoint-4
    assert hf.is_committed(out / "checkpoint-4")
    said = launch("0", 6)
    assert (f"resume_from_checkpoint=False: starting fresh as it asks, though {out}/"
            "checkpoint-4 is committed") in said, said
    assert Steps.done == 6
    said = launch("1", 8)
    assert (f"this is a restart of the job (attempt 1): resuming from {out}/checkpoint-6, "
            "the newest committed checkpoint") in said, said
    assert Steps.done == 2  # steps 7 and 8: resumed, not started over


def test_the_evaluation_before_a_save_is_not_the_saves_blocking_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Walk-through 29: Trainer evaluates between a step's end and its save; a 1.4 MiB save
    read "loop blocked 12.6 s" (the evaluation), and the report blamed checkpoints for 75% of
    the run."""
    import time as clock

    from trainguard.integrations import hf

    blocked: list[float] = []
    commit = hf.mark_committed
    monkeypatch.setattr(hf, "mark_committed", lambda *a, **k: (
        blocked.append(k["blocked_s"]), commit(*a, **k)))
    trainer = tiny_trainer(tmp_path / "out", 2)
    trainer.args.eval_strategy = "steps"
    trainer.args.eval_steps = 2
    trainer.eval_dataset = trainer.train_dataset
    evaluate = trainer.evaluate

    def slow_evaluate(*a: Any, **k: Any) -> Any:
        clock.sleep(1.5)
        return evaluate(*a, **k)

    trainer.evaluate = slow_evaluate
    trainer.add_callback(hf.TrainguardCallback())
    trainer.train()
    assert len(blocked) == 1 and blocked[0] < 1.0, blocked  # the save alone


def test_an_explicit_checkpoint_damaged_since_its_commit_gives_way(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Walk-through 29: the usual `train(resume_from_checkpoint=get_last_checkpoint(out))`
    under --auto-resume hf passed a committed checkpoint truncated since, the load failed
    (not restarted: checkpoint_load_error), and the advice said the integration skips it."""
    from trainguard.integrations import hf

    out = tmp_path / "out"
    hf.patch()
    tiny_trainer(out, 4).train()  # commits checkpoint-2 and checkpoint-4
    weights = out / "checkpoint-4" / "model.safetensors"
    half = weights.stat().st_size // 2
    with open(weights, "r+b") as f:
        f.truncate(half)
    again = tiny_trainer(out, 6)
    again.train(resume_from_checkpoint=str(out / "checkpoint-4"))
    said = capsys.readouterr().out
    assert (f"{out}/checkpoint-4 is damaged since it was committed (model.safetensors is "
            f"{half} bytes") in said, said
    assert f"resuming from {out}/checkpoint-2, the newest intact committed checkpoint" in said
    assert again.state.global_step == 6  # loaded checkpoint-2 (the truncated one would raise)
