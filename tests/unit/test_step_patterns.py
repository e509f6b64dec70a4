"""The default step pattern on real framework output: HF Trainer's tqdm bar (carriage-return
redraws, captured from a run of transformers 5.23), Lightning's rich bar (captured from
pytorch-lightning 2.6.6) and torchtitan's coloured step lines (its metrics logger's format,
`{color.red}step: {step:2}  {color.green}loss: ...`, under its `[titan] ... - INFO - ` prefix)."""

from __future__ import annotations

import io
import re
from pathlib import Path

from trainguard.node.logs import LogRouter
from trainguard.spec import DEFAULT_STEP_PATTERN

DATA = Path(__file__).resolve().parents[1] / "data" / "progress"


def router() -> LogRouter:
    return LogRouter(io.StringIO(), DEFAULT_STEP_PATTERN, lambda rank, step, at: None)


def lines(raw: bytes) -> list[str]:
    """As the agent splits a rank's output: at \\n and at \\r (progress-bar redraws)."""
    text = raw.replace(b"\r\n", b"\n").replace(b"\r", b"\n").decode("utf-8", "replace")
    return text.split("\n")


def test_hf_trainer_progress_bar_gives_every_global_step() -> None:
    r = router()
    steps = [int(s) for line in lines((DATA / "hf_trainer_tqdm.txt").read_bytes())
             if (s := r.step_of(line)) is not None]
    assert sorted(set(steps)) == [1, 2, 3, 4, 5, 6]  # the first draw, 0/6, is no step


def test_lightning_rich_bar_gives_the_batch() -> None:
    r = router()
    steps = [r.step_of(line) for line in lines((DATA / "lightning_rich_bar.txt").read_bytes())]
    assert "6" in steps


def test_torchtitan_coloured_step_lines_count() -> None:
    r = router()
    line = ("[rank0]:[titan] 2026-04-08 10:00:00,123 - root - INFO - \x1b[31mstep: 12  "
            "\x1b[32mloss:  7.8901  \x1b[33mmemory:  5.91GiB(6.22%)  \x1b[34mtps: 1,201  "
            "\x1b[35mtflops: 0.07  \x1b[35mmfu: 0.01%\x1b[39m")
    assert r.step_of(line) == "12"


def test_plain_lines_still_count_and_others_do_not() -> None:
    r = router()
    assert r.step_of("step 42 loss 0.1") == "42"
    assert r.step_of("[rank 1] iteration 7: loss 3") == "7"
    assert r.step_of("Epoch 0:  50%|█████     | 3/6 [00:00<00:00, 9.1it/s, v_num=0]") == "3"
    for other in ("loading shard 3/10", "epoch 2 done",
                  "Writing model shards: 100%|██████████| 1/1 [00:00<00:00, 423.11it/s]"):
        assert r.step_of(other) is None, other
    assert re.compile(DEFAULT_STEP_PATTERN).groups == 5


def test_a_progress_bars_first_draw_is_no_step() -> None:
    """(walk-through 22) HF Trainer's bar draws `0/40` as each attempt starts: read as step
    0, the goodput ledger counted an HF job's 40 steps as 41 done once and a drained stop
    as 18 steps done again. A bar counts steps done: 0 of them is none."""
    r = router()
    assert r.step_of("  0%|          | 0/40 [00:00<?, ?it/s]") is None
    assert r.step_of("Epoch 0:   0%|          | 0/6 [00:00<?, ?it/s]") is None
    assert r.step_of("Epoch 0 ━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━ 0/6 0:00:00 • -:--:--") is None
    assert r.step_of(" 45%|████▌     | 18/40 [00:03<00:04,  5.1it/s]") == "18"
    assert r.step_of(" 25%|██▌       | 10/40 [00:02<00:06,  5.0it/s]") == "10"
    assert r.step_of("Epoch 0 ━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━ 6/6 0:00:01 • 0:00:00") == "6"


def test_the_bar_groups_are_the_progress_bars() -> None:
    pattern = re.compile(DEFAULT_STEP_PATTERN)
    from trainguard.presets import DEFAULT_BAR_GROUPS

    def group(line: str) -> int:
        m = pattern.search(line)
        assert m is not None, line
        return next(i for i, g in enumerate(m.groups(), 1) if g is not None)
    assert group(" 45%|#####     | 135/300 [00:01<00:02, 150.00it/s]") in DEFAULT_BAR_GROUPS
    assert group("Epoch 0 ━━━━━━━━━━━━ 6/6 0:00:01 • 0:00:00 9.1it/s") in DEFAULT_BAR_GROUPS
    for labelled in ("step 42 loss 0.1", '{"step": 5, "loss": 1.0}',
                     "[titan] - INFO - step:  2  loss: 10.8"):
        assert group(labelled) not in DEFAULT_BAR_GROUPS, labelled
