"""JobSpec: precedence, presets, validation messages, the step pattern and the frozen surface."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from trainguard.errors import SpecError, TrainguardError
from trainguard.spec import DEFAULT_STEP_PATTERN, PRESETS, JobSpec, RestartPolicy
from trainguard.spec_build import build_spec

SCRIPT = {"entrypoint": "train.py"}

# Adding a config key is a deliberate act: change this list, the docs and the CLI together.
FROZEN_FIELDS = [
    "entrypoint", "args", "module", "no_python", "nnodes", "nproc_per_node", "node_rank",
    "master_addr", "master_port", "run_id", "job_dir", "log_dir", "checkpoint_dir",
    "redirects", "local_ranks_filter", "monitor_interval", "scenario", "max_restarts",
    "unconditional_restart", "restart_backoff_s",
    "restart_backoff_max_s", "no_progress_limit", "grace_period_s", "save_on_exit", "step_pattern",
    "hang_detection", "hang_timeout_s", "hang_floor_s", "hang_startup_s", "restart_on_hang",
    "operator_reexecution", "step_retries", "max_step_retries", "step_retry_timeout_s",
    "in_process_restart", "in_process_timeout_s", "standby_workers", "memory_every",
    "prewarm_imports", "auto_resume", "restart_args",
    "spare_nodes", "backend", "node_timeout_s", "reconnect_grace_s", "max_pod_reschedules",
    "max_job_reschedules", "repeat_offender", "queue_timeout_s", "precheck", "metrics_host",
    "metrics_port", "min_free_disk_mb",
    "expect_accelerators", "controller_host",
]


def spec_error(job_file: dict[str, Any] | None, flags: dict[str, Any]) -> SpecError:
    with pytest.raises(SpecError) as info:
        build_spec(job_file, {**SCRIPT, **flags})
    return info.value


def test_the_set_of_job_spec_fields_is_frozen() -> None:
    assert sorted(JobSpec.model_fields) == sorted(FROZEN_FIELDS)


# --- precedence ---------------------------------------------------------------------------


def test_defaults_apply_when_nothing_is_given() -> None:
    spec = build_spec(None, SCRIPT)
    assert spec.max_restarts == 0
    assert spec.unconditional_restart is False
    assert spec.nproc_per_node == 1
    assert spec.step_pattern == DEFAULT_STEP_PATTERN
    assert spec.run_id.startswith("tg-")


def test_a_preset_overrides_the_defaults() -> None:
    assert build_spec(None, {**SCRIPT, "scenario": "single-node"}).max_restarts == 3


def test_the_job_file_overrides_the_preset() -> None:
    spec = build_spec({"max_restarts": 5}, {**SCRIPT, "scenario": "single-node"})
    assert spec.max_restarts == 5
    assert spec.restart_backoff_s == PRESETS["single-node"]["restart_backoff_s"]


def test_flags_override_the_job_file() -> None:
    spec = build_spec({"max_restarts": 5, "nproc_per_node": 2},
                      {**SCRIPT, "scenario": "single-node", "max_restarts": 7})
    assert (spec.max_restarts, spec.nproc_per_node) == (7, 2)


def test_a_scenario_named_in_the_job_file_selects_its_preset() -> None:
    spec = build_spec({"scenario": "llm"}, SCRIPT)
    assert spec.max_restarts == PRESETS["llm"]["max_restarts"]


def test_a_scenario_flag_beats_the_scenario_in_the_job_file() -> None:
    spec = build_spec({"scenario": "llm"}, {**SCRIPT, "scenario": "single-node"})
    assert spec.scenario == "single-node"
    assert spec.max_restarts == PRESETS["single-node"]["max_restarts"]


def test_a_job_file_value_may_turn_off_what_a_preset_turned_on() -> None:
    spec = build_spec({"unconditional_restart": False}, {**SCRIPT, "scenario": "multi-node"})
    assert spec.unconditional_restart is False


# --- presets ------------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", sorted(PRESETS))
def test_each_scenario_preset_sets_exactly_its_documented_values(scenario: str) -> None:
    spec = build_spec(None, {**SCRIPT, "scenario": scenario})
    assert spec.scenario == scenario
    for key, value in PRESETS[scenario].items():
        assert getattr(spec, key) == value, key


@pytest.mark.parametrize("scenario", sorted(PRESETS))
def test_preset_keys_are_job_spec_fields(scenario: str) -> None:
    assert set(PRESETS[scenario]) <= set(JobSpec.model_fields)


# docs/scenarios.md, the table of scenario presets
DOCUMENTED = {
    None: {"max_restarts": 0, "unconditional_restart": False, "restart_backoff_s": 1.0,
           "restart_backoff_max_s": 60.0, "no_progress_limit": 3},
    "single-node": {"max_restarts": 3, "unconditional_restart": False,
                    "restart_backoff_s": 1.0, "restart_backoff_max_s": 30.0,
                    "no_progress_limit": 3},
    "multi-node": {"max_restarts": 10, "unconditional_restart": True, "restart_backoff_s": 2.0,
                   "restart_backoff_max_s": 120.0, "no_progress_limit": 3},
    "llm": {"max_restarts": 100, "unconditional_restart": True, "restart_backoff_s": 5.0,
            "restart_backoff_max_s": 300.0, "no_progress_limit": 5},
}


@pytest.mark.parametrize("scenario", list(DOCUMENTED))
def test_each_scenario_gives_the_values_in_the_documented_table(scenario: str | None) -> None:
    spec = build_spec(None, {**SCRIPT, "scenario": scenario})
    assert {k: getattr(spec, k) for k in DOCUMENTED[scenario]} == DOCUMENTED[scenario]


DOCS = Path(__file__).resolve().parents[2] / "docs" / "scenarios.md"


def documented_table() -> dict[str | None, dict[str, Any]]:
    cells = {"on": True, "off": False}
    table: dict[str | None, dict[str, Any]] = {k: {} for k in DOCUMENTED}
    for line in DOCS.read_text(encoding="utf-8").splitlines():
        row = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(row) != 5 or row[0] not in DOCUMENTED["llm"]:
            continue
        for scenario, cell in zip(DOCUMENTED, row[1:], strict=True):
            word = cell.split()[0]
            table[scenario][row[0]] = cells[word] if word in cells else float(word)
    return table


@pytest.mark.skipif(not DOCS.is_file(), reason="docs/scenarios.md is not in this checkout")
def test_the_documented_table_in_docs_matches_the_presets() -> None:
    assert documented_table() == DOCUMENTED


def test_the_scenarios_grow_more_tolerant_from_single_node_to_llm() -> None:
    single, multi, llm = PRESETS["single-node"], PRESETS["multi-node"], PRESETS["llm"]
    assert single["max_restarts"] < multi["max_restarts"] < llm["max_restarts"]
    assert single["unconditional_restart"] is False
    assert multi["unconditional_restart"] is True and llm["unconditional_restart"] is True


def test_an_unknown_scenario_is_a_spec_error_listing_the_known_ones() -> None:
    err = spec_error(None, {"scenario": "huge"})
    assert err.key == "scenario"
    assert all(name in err.fix for name in PRESETS)


# --- unknown keys and bad values ----------------------------------------------------------


def test_an_unknown_job_file_key_names_the_key_and_suggests_the_close_match() -> None:
    err = spec_error({"max_restart": 3}, {})
    assert "max_restart" in err.key
    assert "'max_restarts'" in err.fix
    assert isinstance(err, TrainguardError)


def test_every_bad_key_of_a_job_file_is_said_at_once() -> None:
    """Walk-through 25: two mistakes were told one at a time."""
    err = spec_error({"restart_backoff": 2, "max_restarts": "yes", "nproc_per_node": 2}, {})
    assert str(err).startswith("job file: 2 problems: restart_backoff: unknown key (did you "
                               "mean 'restart_backoff_s'"), str(err)
    assert "; max_restarts: 'yes' (str) is not a whole number" in str(err), str(err)


def test_an_unknown_key_with_nothing_close_lists_the_valid_keys() -> None:
    err = spec_error({"flux_capacitor": 1}, {})
    assert "flux_capacitor" in str(err)
    assert "max_restarts" in err.fix and "nproc_per_node" in err.fix


def test_the_source_of_an_unknown_key_is_named() -> None:
    with pytest.raises(SpecError, match=r"job file /tmp/job\.yaml: max_restart"):
        build_spec({"max_restart": 3}, SCRIPT, source="job file /tmp/job.yaml")


@pytest.mark.parametrize(
    ("values", "key", "fix_words"),
    [
        ({"max_restarts": 129}, "max_restarts", ["--max-restarts", "1-128"]),
        ({"max_restarts": -1}, "max_restarts", ["--max-restarts"]),
        ({"grace_period_s": -1.0}, "grace_period_s", ["'grace_period_s'"]),
        ({"step_pattern": r"step \d+"}, "step_pattern", ["capture group", "step (\\d+)"]),
        ({"step_pattern": "step (\\d+"}, "step_pattern", ["regular expression"]),
        ({"spare_nodes": -1}, "spare_nodes", ["--spare-nodes"]),
        ({"nproc_per_node": 0}, "nproc_per_node", ["--nproc-per-node"]),
        ({"monitor_interval": 0}, "monitor_interval", ["--monitor-interval"]),
    ],
)
def test_a_bad_value_is_a_spec_error_naming_the_key_and_a_fix(
    values: dict[str, Any], key: str, fix_words: list[str]
) -> None:
    err = spec_error(None, values)
    assert err.key == key
    assert err.fix
    message = str(err)
    assert message.startswith(f"{key}: ")
    for word in fix_words:
        assert word in message
    assert "Fix:" in message


def test_a_missing_entrypoint_asks_for_the_training_script() -> None:
    with pytest.raises(SpecError) as info:
        build_spec(None, {})
    assert info.value.key == "entrypoint"
    assert "training script" in info.value.fix


def test_module_and_no_python_together_are_refused() -> None:
    err = spec_error(None, {"module": True, "no_python": True})
    assert "-m/--module" in err.key and "--no-python" in err.key
    assert "cannot both be set" in err.problem


def test_a_backoff_cap_below_the_first_delay_is_refused() -> None:
    err = spec_error(None, {"restart_backoff_s": 10, "restart_backoff_max_s": 5})
    assert "--restart-backoff-max / 'restart_backoff_max_s'" in err.key
    assert "--restart-backoff / 'restart_backoff_s'" in err.key
    assert "at least 10" in err.fix


def test_a_node_rank_in_a_multi_node_job_names_the_flag_and_says_to_drop_it() -> None:
    err = spec_error(None, {"nnodes": 2, "node_rank": 1})
    assert err.key.startswith("--node-rank / 'node_rank'")
    assert "one controller" in err.fix and "drop --node-rank" in err.fix


def test_a_conflict_names_where_each_value_came_from() -> None:
    err = spec_error({"restart_backoff_s": 400}, {"scenario": "llm"})
    assert "'restart_backoff_s' (from the job file)" in err.key
    assert "'restart_backoff_max_s' (from the llm preset)" in err.key


@pytest.mark.parametrize(
    ("values", "key", "want"),
    [
        ({"max_restarts": True}, "max_restarts", "whole number"),  # YAML `yes`
        ({"max_restarts": 1.5}, "max_restarts", "whole number"),
        ({"precheck": "no"}, "precheck", "true or false"),
        ({"restart_backoff_s": "2"}, "restart_backoff_s", "a number"),
        ({"backend": "k8s"}, "backend", "one of local, slurm"),
        ({"args": "--lr 1"}, "args", "a list"),
    ],
)
def test_a_job_file_value_of_the_wrong_type_is_refused_not_coerced(
    values: dict[str, Any], key: str, want: str
) -> None:
    err = spec_error(values, {})
    assert err.key == f"job file: {key}"
    assert want in err.problem and "Fix: write" in str(err)


def test_numbers_in_the_job_files_args_become_strings() -> None:
    assert build_spec({"args": ["--steps", 200, "--lr", 0.5]}, SCRIPT).args == [
        "--steps", "200", "--lr", "0.5"]


def test_a_spec_is_frozen_and_has_no_extra_keys() -> None:
    spec = build_spec(None, SCRIPT)
    with pytest.raises(Exception, match="frozen"):
        spec.max_restarts = 3


def test_the_restart_policy_carries_the_spec_values() -> None:
    spec = build_spec(None, {**SCRIPT, "max_restarts": 4, "unconditional_restart": True,
                             "restart_backoff_s": 2, "restart_backoff_max_s": 8,
                             "no_progress_limit": 5})
    assert spec.restart_policy == RestartPolicy(
        max_restarts=4, unconditional=True, unconditional_max_consecutive=3, backoff_s=2.0,
        backoff_max_s=8.0, no_progress_limit=5)


def test_world_size_is_nodes_times_workers_per_node() -> None:
    assert build_spec(None, {**SCRIPT, "nproc_per_node": 4}).world_size == 4


# --- the default step pattern -------------------------------------------------------------


def step_of(line: str) -> int | None:
    """As node.logs.LogRouter.step_of reads it: the first group that matched."""
    m = re.compile(DEFAULT_STEP_PATTERN).search(line)
    return next((int(g) for g in m.groups() if g is not None), None) if m else None


@pytest.mark.parametrize(
    ("line", "step"),
    [
        ("step 21 loss 2.3", 21),
        (" iteration      100/  500000 | consumed samples: 3200 |", 100),
        ("[rank0]: Step 5: loss 4.1", 5),
        ("global_step=7 loss=1.25", 7),
        ("iter 3: loss 4.2135, time 80.01ms", 3),
        ("[2026-01-01 10:00:00] step: 42 loss 1.0", 42),
        # walk-through 21: `logging` prefixes, an epoch first, JSON lines (none was progress)
        ("INFO:root:step 5 loss 1.0", 5),
        ("2026-12-04 10:00:00,123 - INFO - step 5 loss 1.0", 5),
        ("2026-12-04 10:00:00,123 - train - INFO - step 9 loss 1.0", 9),
        ("2026-12-04 10:00:00.123 | INFO     | __main__:train:42 - step 7 loss 1", 7),
        ("INFO:__main__:step 3", 3),
        ('{"step": 5, "loss": 1.0}', 5),
        ('{"loss": 1.0, "global_step": 12}', 12),
    ],
)
def test_the_default_step_pattern_finds_the_step_of_common_training_logs(
    line: str, step: int
) -> None:
    assert step_of(line) == step


@pytest.mark.parametrize(
    "line",
    ["resumed from step 20", "stepping 3", "loading checkpoint of step 9", "iterations: 5",
     "INFO - resumed from step 20", "INFO:root:Resuming: step 5", "WARNING:root:step 5 failed",
     "2026-12-04 10:00:00,123 - INFO - loading checkpoint of step 9", "epoch 2 done",
     "INFO: Epoch 3 finished", '{"loss": 1.0}',
     # a review of walk-through 21's change: a resume, a checkpoint's step, any `word: step N`
     "INFO: Resuming: step 20", "2026-12-04 10:00:00,123 - INFO - Resumed: step 20",
     "INFO - checkpoint: step 500", '{"event": "resumed", "step": 20}', "Some info: step 3",
     # an epoch's own count starts again: not read (a step that goes back is no progress)
     "Epoch 1 | Step 5 | loss 2", "epoch 0 step 5", "epoch 0 | step 5/100 | loss 0.3"],
)
def test_the_default_step_pattern_ignores_lines_that_only_mention_a_step(line: str) -> None:
    assert step_of(line) is None


def test_the_default_step_pattern_costs_little_on_long_runs_of_spaces_or_brackets() -> None:
    """The agent reads every line of every rank with it (up to 64 KiB a line): an overlap of
    its prefixes was tried 80 times over (173 ms for 64 KiB of spaces in review)."""
    import time

    pattern = re.compile(DEFAULT_STEP_PATTERN)
    for line in (" " * 65536, "[a]" * 21845, "x" * 65536):
        start = time.process_time()
        pattern.search(line)
        assert time.process_time() - start < 0.06, line[:10]
