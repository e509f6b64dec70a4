"""The trainer integrations' shared parts: which checkpoint a restart resumes from, and the
site hook that patches a framework when the script imports it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from trainguard.integrations import autoresume
from trainguard.integrations.common import (
    COMMIT_MARKER,
    is_committed,
    mark_committed,
    newest,
    numbered_dirs,
)
from trainguard.integrations.hf import last_checkpoint


def ckpt(root: Path, n: int, *, state: bool = True, marked: bool = False,
         sentinel: bool = False) -> Path:
    d = root / f"checkpoint-{n}"
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(b"x")
    if state:
        (d / "trainer_state.json").write_text("{}")
    if sentinel:
        (d / "checkpoint-is-incomplete.txt").write_text("")
    if marked:
        mark_committed(d, n)
    return d


def test_the_newest_committed_checkpoint_wins_over_newer_unmarked_ones(tmp_path: Path) -> None:
    ckpt(tmp_path, 4, marked=True)
    ckpt(tmp_path, 8)  # complete, but its commit never happened (a rank died)
    ckpt(tmp_path, 1006, state=False)  # a save cut short
    assert last_checkpoint(tmp_path) == str(tmp_path / "checkpoint-4")
    assert is_committed(tmp_path / "checkpoint-4") and not is_committed(tmp_path / "checkpoint-8")


def test_without_any_marker_the_newest_complete_one_counts(tmp_path: Path) -> None:
    ckpt(tmp_path, 3)
    ckpt(tmp_path, 6, sentinel=True)  # Trainer's own save-on-SIGTERM left it incomplete
    ckpt(tmp_path, 9, state=False)
    assert last_checkpoint(tmp_path) == str(tmp_path / "checkpoint-3")


def test_a_first_attempt_has_nothing_to_resume_and_that_is_no_error(tmp_path: Path) -> None:
    assert last_checkpoint(tmp_path / "not-yet") is None
    assert last_checkpoint(None) is None
    ckpt(tmp_path, 2, state=False)
    assert last_checkpoint(tmp_path) is None


def test_an_unreadable_marker_trusts_nothing_unmarked(tmp_path: Path) -> None:
    ckpt(tmp_path, 5)
    (ckpt(tmp_path, 7) / COMMIT_MARKER).write_text("{not json")
    found = newest(numbered_dirs(tmp_path, r"checkpoint-(\d+)"), lambda d: True)
    assert found is None


def test_the_site_hook_patches_the_framework_right_after_the_script_imports_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "fakefw.py").write_text("class Trainer:\n    def train(self):\n        "
                                        "return 'plain'\n")
    (tmp_path / "fakepatch.py").write_text(
        "import fakefw\n\ndef patch():\n    fakefw.Trainer.train = lambda self: 'patched'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(autoresume.TARGETS, "fake", ("fakefw", "fakepatch"))
    monkeypatch.setenv("TRAINGUARD_AUTO_RESUME", "fake")
    before = list(sys.meta_path)
    monkeypatch.setattr(sys, "meta_path", before[:])
    for name in ("fakefw", "fakepatch"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    autoresume.install()
    import fakefw  # type: ignore[import-not-found]

    assert fakefw.Trainer().train() == "patched"


def test_without_the_variable_the_hook_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRAINGUARD_AUTO_RESUME", raising=False)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    n = len(sys.meta_path)
    autoresume.install()
    assert len(sys.meta_path) == n
