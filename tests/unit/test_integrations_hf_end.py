"""Where a resumed Hugging Face run by max_steps is already over (integrations.hf._run_over) and the
training loss it reports then (logged_mean_loss): Trainer resumed from its last step trains
one step past the end (transformers 5.23), so trainguard loads such a checkpoint instead."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from trainguard.integrations.hf import _run_over, logged_mean_loss


def trainer(max_steps: int = -1, epochs: float = 3.0, **kw: bool) -> Any:
    """What _run_over reads of a Trainer."""
    return SimpleNamespace(args=SimpleNamespace(max_steps=max_steps, num_train_epochs=epochs),
                           is_deepspeed_enabled=kw.get("deepspeed", False),
                           is_fsdp_enabled=kw.get("fsdp", False))


def ckpt(tmp_path: Path, **state: object) -> str:
    d = tmp_path / f"checkpoint-{state.get('global_step', 0)}"
    d.mkdir()
    (d / "trainer_state.json").write_text(json.dumps(state))
    return str(d)


def test_a_checkpoint_at_max_steps_is_the_run_over(tmp_path: Path) -> None:
    path = ckpt(tmp_path, global_step=14, max_steps=14, num_train_epochs=1)
    assert _run_over(trainer(max_steps=14), path) == 14
    # a user who raised max_steps trains on from it
    assert _run_over(trainer(max_steps=20), path) is None
    # one short of the end is a resume like any other
    short = ckpt(tmp_path, global_step=13, max_steps=14, num_train_epochs=1)
    assert _run_over(trainer(max_steps=14), short) is None


@pytest.mark.parametrize("epochs", [3.0, 2.5, 4.0])
def test_a_run_by_epochs_is_left_to_trainer(tmp_path: Path, epochs: float) -> None:
    """Review 34 #4: a run by whole epochs trains nothing past its end by itself, and one by a
    fraction of an epoch cannot be told from the checkpoint (2.5 epochs, then 3.0 asked for:
    the same stored epoch count, 2 steps more to train; they were declared over)."""
    path = ckpt(tmp_path, global_step=192, max_steps=192, num_train_epochs=3)
    assert _run_over(trainer(epochs=epochs), path) is None


@pytest.mark.parametrize("kw", [{"deepspeed": True}, {"fsdp": True}])
def test_deepspeed_and_fsdp_keep_trainers_own_resume(tmp_path: Path, kw: dict[str, bool]) -> None:
    path = ckpt(tmp_path, global_step=14, max_steps=14, num_train_epochs=1)
    assert _run_over(trainer(max_steps=14, **kw), path) is None


@pytest.mark.parametrize("text", ["", "{", json.dumps({"max_steps": 14}),
                                  json.dumps({"global_step": "x"})])
def test_an_unreadable_state_is_left_to_trainers_own_load(tmp_path: Path, text: str) -> None:
    d = tmp_path / "checkpoint-14"
    d.mkdir()
    (d / "trainer_state.json").write_text(text)
    assert _run_over(trainer(max_steps=14), str(d)) is None
    assert _run_over(trainer(max_steps=14), str(tmp_path / "gone")) is None


def test_the_mean_loss_weighs_each_logged_loss_by_the_steps_it_covers() -> None:
    history = [{"loss": 4.0, "step": 2}, {"eval_loss": 9.0, "step": 2},
               {"loss": 1.0, "step": 3}, {"loss": 7.0, "step": 3}]  # a repeat adds nothing
    assert logged_mean_loss(history) == pytest.approx((4.0 * 2 + 1.0) / 3)
    assert logged_mean_loss([]) == 0.0
