"""The integrations' Resumed location is absolute, as CheckpointSaved's (walk-through 29, #13:
HF's read `runs/x/out/checkpoint-10`, meaningless where `trainguard events` runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trainguard.integrations import common


def test_the_resumed_location_is_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(common.channel, "send", lambda kind, **f: sent.append(f))
    monkeypatch.chdir(tmp_path)
    common.resumed(Path("runs/out/checkpoint-10"), 10)
    assert sent[0]["location"] == str(tmp_path / "runs" / "out" / "checkpoint-10")


def test_a_rank_s_resumed_names_the_newer_damaged_step_it_skipped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Walk-through 39 #13: only rank 0 tells a damaged checkpoint (CheckpointCorrupt), and
    another rank's Resumed could reach the launcher first: the Resumed event read before what
    explains it. Every rank's Resumed now carries the newest damaged step it passed over, and
    the launcher says so in the event (the contract lets the field through)."""
    from datetime import datetime, timezone

    from trainguard.controller.incidents import IncidentBook
    from trainguard.controller.store import JobStore
    from trainguard.controller.worker_messages import WorkerMessages
    from trainguard.integrations.hf import CHECKPOINT_DIR, complete
    from trainguard.protocol import WorkerMessage
    from trainguard.worker.contract import validate

    sent: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(common.channel, "send", lambda kind, **f: sent.append((kind, f)))
    monkeypatch.setenv("RANK", "1")
    out = tmp_path / "out"
    for step in (4, 8):
        d = out / f"checkpoint-{step}"
        d.mkdir(parents=True)
        (d / "model.safetensors").write_bytes(b"w" * 100)
        (d / "trainer_state.json").write_text("{}")
        common.mark_committed(d, step)
    (out / "checkpoint-8" / "model.safetensors").write_bytes(b"w" * 10)  # truncated since
    sent.clear()
    found = common.newest(common.numbered_dirs(out, CHECKPOINT_DIR), complete)
    assert found == out / "checkpoint-4"
    common.resumed(found, 4)
    assert [k for k, _ in sent] == ["resumed"]  # rank 1 tells no CheckpointCorrupt
    fields = validate("resumed", sent[0][1])
    assert fields["skipped_step"] == 8

    seen: list[str] = []
    h = WorkerMessages(lambda level, reason, message, **_: seen.append(message),
                       IncidentBook(JobStore.create(tmp_path / "job", "r")))
    h.handle([WorkerMessage(kind="resumed", rank=1, at=datetime.now(timezone.utc),
                            data=fields)], attempt=1)
    assert seen == [f"resumed from the checkpoint of step 4 at {found.absolute()} (the newer "
                    "checkpoint of step 8 is damaged and was skipped: CheckpointCorrupt says "
                    "why)"]
    sent.clear()
    common.resumed(found, 4)  # the next resume's search starts afresh
    assert "skipped_step" not in sent[0][1]
