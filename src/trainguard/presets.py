"""The scenario presets (docs/scenarios.md says why each turns on what) and the default step
pattern: data that JobSpec's defaults are made of. Pure."""

from __future__ import annotations

from typing import Any

# Defaults each scenario of the seed table turns on (docs/scenarios.md says why).
PRESETS: dict[str, dict[str, Any]] = {
    "single-node": {"max_restarts": 3, "unconditional_restart": False,
                    "restart_backoff_s": 1.0, "restart_backoff_max_s": 30.0,
                    "no_progress_limit": 3},
    "multi-node": {"max_restarts": 10, "unconditional_restart": True, "restart_on_hang": True,
                   "restart_backoff_s": 2.0, "restart_backoff_max_s": 120.0,
                   "no_progress_limit": 3},
    "llm": {"max_restarts": 100, "unconditional_restart": True, "restart_on_hang": True,
            "restart_backoff_s": 5.0, "restart_backoff_max_s": 300.0,
            "no_progress_limit": 5, "save_on_exit": True, "operator_reexecution": True,
            "memory_every": 10},
}

# A line that *starts* with "step N" / "iteration N" / "global_step=N" (after optional
# bracketed prefixes such as "[rank0]:" or "[2026-01-01 10:00:00]", or a `logging` prefix up
# to its INFO/DEBUG level and logger name: `INFO:root:`, `2026-01-01 10:00:00,123 - INFO - `,
# loguru's `| INFO | mod:fn:42 - `): nanoGPT, Megatron, torchtitan and most hand-written
# loops. "resumed from step 20", "INFO: Resuming: step 20" and "INFO - checkpoint: step 500"
# are not progress. A step after an epoch (`Epoch 1 | Step 5`) is not read: it is often the
# epoch's own count, which starts again, and a step that goes back is no progress (the hang
# detector would then see none for a whole epoch); such jobs pass --step-pattern or call
# trainguard.progress (NoProgressSignal says so). The logging prefix starts at a character
# that is neither a space nor `[` (else a long run of them is tried 80 times over: the agent
# reads every line of every rank with this pattern).
DEFAULT_STEP_PATTERN = (
    r"(?i)^\s*(?:\[[^\]]*\]:?\s*)*"
    r"(?:(?:[^\s\[][^\n]{0,79}?)?\b(?-i:INFO|DEBUG)\b[\s\-:|\]]+"
    r"(?:[\w.<>]+:[\w<>]+:\d+\s*-\s*|[\w.<>]+:(?=\S))?)?"
    r"(?:global[_ ]step|step|iter(?:ation)?)\b\s*[:=#]?\s*\[?\s*(\d+)"
    # a training progress bar (tqdm: HF Trainer, Lightning's `Epoch 0:`), not a labelled one
    # such as `Writing model shards: 100%|...| 1/1 [`: ` 50%|█████     | 3/6 [`; a bar counts
    # steps done, so its first draw (`0/40`) is no step
    r"|^\s*(?:Epoch \d+:\s*)?\d+%\|[^|]*\|\s*([1-9]\d*)/\d+\s*\["
    r"|━\s+([1-9]\d*)/\d+\s+\d+:\d\d:\d\d"  # a rich progress bar (Lightning): `━━ 6/6 0:00:01`
    r"|\bstep:\s*(\d+)\s+loss\b"  # torchtitan: `... - INFO - step:  2  loss: 10.8`
    # a JSON line (`{"step": 5, "loss": 1.0}`), not a resume's (`{"event": "resumed", ...}`)
    r'|^\s*\{(?![^\n]*resum)[^\n]*?"(?:global_)?step"\s*:\s*(\d+)'
)
# the pattern's groups that read a progress bar (tqdm's, rich's): a bare bar does not say
# whether it trains or evaluates, so once a rank's steps were read from a labelled line
# (the other groups) its bars are not read as steps (node/logs.py; walk-through 33 #6: an
# evaluation's `135/300` bar made a 40-step job's last step 300, 280 steps "lost")
DEFAULT_BAR_GROUPS = frozenset({2, 3})
