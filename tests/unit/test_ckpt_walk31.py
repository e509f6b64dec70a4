"""The checkpoint save side, walk-through 31: a commit is reported as soon as it is durable
(#14) with the whole checkpoint's size (#7); a save that writes nothing says why (#12: skipped
behind a save in flight; #3: the step committed by another job); a failed last save says no
save follows (#5) and names the newest committed step on every rank (#4); a killed attempt's
staging dir of the step just committed is removed (#11)."""

from __future__ import annotations

import errno
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import trainguard.checkpoint.checkpointer as ckmod  # noqa: E402
import trainguard.checkpoint.saving as saving  # noqa: E402
from trainguard.checkpoint.manifest import LATEST, MANIFEST, Manifest, step_dir  # noqa: E402
from trainguard.worker import channel  # noqa: E402
from trainguard.worker.contract import MessageKind, validate  # noqa: E402


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[MessageKind, dict[str, Any]]]:
    out: list[tuple[MessageKind, dict[str, Any]]] = []

    def send(kind: MessageKind, **fields: Any) -> bool:
        validate(kind, fields)  # as the agent checks it
        out.append((kind, fields))
        return True

    monkeypatch.setattr(channel, "send", send)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-a")
    return out


def of(sent: list[tuple[MessageKind, dict[str, Any]]], kind: MessageKind) -> list[dict[str, Any]]:
    return [f for k, f in sent if k == kind]


def state() -> dict[str, Any]:
    return {"model": torch.nn.Linear(4, 4)}


def ckpt(where: Path, **kw: Any) -> ckmod.Checkpointer:
    return ckmod.Checkpointer(where, save_on_exit=False, **kw)


def test_the_commit_is_reported_before_latest_and_pruning(
        tmp_path: Path, sent: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """#14: the rank is killed after the commit, while pruning (here: a BaseException, as
    the kill ends the thread): the step is committed, and its CheckpointSaved was sent."""
    seen_latest: list[bool] = []

    def killed(*a: Any, **k: Any) -> None:
        seen_latest.append((tmp_path / "ck" / LATEST).exists())
        raise SystemExit("killed")

    monkeypatch.setattr(saving, "prune", killed)
    c = ckpt(tmp_path / "ck", async_save=False)
    with pytest.raises(SystemExit):
        c.save(5, state())
    assert (tmp_path / "ck" / step_dir(5) / MANIFEST).is_file()
    saved = of(sent, MessageKind.CHECKPOINT_SAVED)
    assert [s["step"] for s in saved] == [5]
    assert seen_latest == [True]  # latest came after the report, before the kill


def test_the_saved_size_is_the_whole_checkpoints(tmp_path: Path) -> None:
    """#7: the manifest's files of every rank, not rank 0's own."""
    st = saving.Storage(tmp_path / "ck")
    told: list[saving.SaveResult] = []

    def job(rank: int) -> saving.SaveJob:
        return saving.SaveJob(
            storage=st, step=5, rank=rank, world_size=2, token="t", keep=3,
            replicated={"w": torch.zeros(1000)} if rank == 0 else None,
            per_rank={"x": torch.zeros(500)}, commit_timeout_s=10, library_version="x",
            on_commit=told.append)

    saving.run_save(job(1))
    r0 = saving.run_save(job(0))
    m = Manifest.from_json((tmp_path / "ck" / step_dir(5) / MANIFEST).read_bytes())
    total = sum(f.size for f in m.files)
    assert r0.total_bytes == total > r0.bytes_written
    assert [r.total_bytes for r in told] == [total]


def test_a_committed_step_removes_another_attempts_staging_of_that_step(
        tmp_path: Path, sent: list[Any]) -> None:
    """#11: a killed attempt's `.tmp-step-10-...` goes when step 10 is committed anew."""
    left = tmp_path / "ck" / f".tmp-{step_dir(10)}-killed-0-1"
    left.mkdir(parents=True)
    (left / "replicated.pt").write_bytes(b"x" * 100)
    c = ckpt(tmp_path / "ck", async_save=False)
    c.save(10, state())
    assert (tmp_path / "ck" / step_dir(10) / MANIFEST).is_file()
    assert not left.exists()


def stall_saves(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Saves wait (up to 10 s) until the returned event is set: a stalled store."""
    go = threading.Event()
    real = ckmod.run_save

    def slow(job: Any) -> Any:
        go.wait(10)
        return real(job)

    monkeypatch.setattr(ckmod, "run_save", slow)
    return go


def test_skipped_saves_are_told_once_a_minute(
        tmp_path: Path, sent: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """#12: if_busy="skip" behind a stalled store: a Warning naming the save in flight."""
    go = stall_saves(monkeypatch)
    c = ckpt(tmp_path / "ck", every_steps=5, if_busy="skip")
    s = state()
    assert c.maybe_save(5, s)
    assert not c.maybe_save(10, s) and not c.maybe_save(15, s)
    go.set()
    c.close()
    skipped = of(sent, MessageKind.CHECKPOINT_SAVE_SKIPPED)
    # 15: within the minute, not told; close() writes it (walk-through 35 F10), so the run
    # it ends holds only 10, told already: no summary (review 38 #3)
    assert [x["step"] for x in skipped] == [10]
    assert "the save of step 5 is still being written" in skipped[0]["reason"]
    assert "if_busy='skip'" in skipped[0]["reason"]
    # 15, skipped at the last step, is saved by close() (walk-through 35 F10)
    assert [x["step"] for x in of(sent, MessageKind.CHECKPOINT_SAVED)] == [5, 15]


def test_a_step_committed_by_another_job_is_a_warning(
        tmp_path: Path, sent: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """#3: job B's save of a step job A committed wrote nothing in silence."""
    ckpt(tmp_path / "ck", async_save=False).save(10, state())  # job-a
    m = json.loads((tmp_path / "ck" / step_dir(10) / MANIFEST).read_text())
    assert m["extra"] == {"run_id": "job-a"}
    ckpt(tmp_path / "ck", async_save=False).save(10, state())  # job-a again: its own
    assert of(sent, MessageKind.CHECKPOINT_SAVE_SKIPPED) == []
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-b")
    ckpt(tmp_path / "ck", async_save=False).save(10, state())
    (told,) = of(sent, MessageKind.CHECKPOINT_SAVE_SKIPPED)
    assert told["step"] == 10
    assert "committed by the job 'job-a'" in told["reason"]
    assert "Fix: give each job its own --checkpoint-dir" in told["reason"]


def failing_at(steps: set[int], monkeypatch: pytest.MonkeyPatch,
               before: threading.Event | None = None) -> None:
    real = ckmod.run_save

    def run_save(job: Any) -> Any:
        if job.step in steps:
            if before is not None:
                before.wait(10)
            raise OSError(errno.EROFS, "Read-only file system")
        return real(job)

    monkeypatch.setattr(ckmod, "run_save", run_save)


def test_the_last_saves_failure_says_no_save_follows(
        tmp_path: Path, sent: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """#5: a final save that fails while close() waits for it, and one that failed before
    close(): the events end with "no save follows", not "the next save retries"."""
    for early in (False, True):
        sent.clear()
        closing = threading.Event()
        failing_at({20}, monkeypatch, None if early else closing)
        c = ckpt(tmp_path / f"ck{early}", every_steps=10)
        for step in (10, 20):
            c.maybe_save(step, state())
        if early:
            c.wait_quietly()
        else:
            threading.Timer(0.3, closing.set).start()
        with pytest.raises(ckmod.CheckpointError):
            c.close()
        failed = of(sent, MessageKind.CHECKPOINT_SAVE_FAILED)
        assert failed[-1]["step"] == 20 and failed[-1]["on_exit"], failed
        assert "no save follows" in failed[-1]["on_exit"]
        assert len(failed) == (2 if early else 1)


def test_close_names_the_newest_committed_step_on_every_rank(
        tmp_path: Path, sent: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """#4: rank 1 said "(none)" while steps were committed (only rank 0 knew them)."""
    ckpt(tmp_path / "ck", async_save=False).save(25, state())  # committed
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    failing_at({30}, monkeypatch)
    c = ckpt(tmp_path / "ck", every_steps=30)
    assert c.rank == 1
    c.maybe_save(30, state())
    with pytest.raises(ckmod.CheckpointError) as e:
        c.close()
    assert "the newest committed checkpoint (25)" in str(e.value)


def test_save_events_keep_their_timing(tmp_path: Path, sent: list[Any]) -> None:
    """The commit's report still says how long the loop waited (goodput reads it)."""
    c = ckpt(tmp_path / "ck", async_save=False)
    t0 = time.monotonic()
    c.save(5, state())
    (saved,) = of(sent, MessageKind.CHECKPOINT_SAVED)
    assert 0 <= saved["blocked_s"] <= time.monotonic() - t0
    assert saved["bytes"] > 0 and saved["resumed_before_s"] == 0
