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
