"""An unknown job-file key suggests the key meant, matched on its words and its flag's."""

from __future__ import annotations

import pytest

from trainguard.errors import SpecError
from trainguard.spec import FIELDS, flag_name
from trainguard.spec_build import build_spec
from trainguard.suggest import closest


def suggestion(key: str) -> str:
    with pytest.raises(SpecError) as info:
        build_spec({key: 30}, {"entrypoint": "train.py"})
    return info.value.fix


@pytest.mark.parametrize(
    ("typed", "meant"),
    [
        ("hang_startup_timeout_s", "hang_startup_s"),  # the words of --hang-startup-timeout
        ("startup_timeout", "hang_startup_s"),
        ("hang_timeout", "hang_timeout_s"),
        ("max_restart", "max_restarts"),
        ("max_restrats", "max_restarts"),
        ("no_hang_detection", "hang_detection"),  # the flag's spelling
        ("ckpt_dir", "checkpoint_dir"),
        ("grace_period", "grace_period_s"),
        ("restart_backoff_max", "restart_backoff_max_s"),
        ("nproc_per_nod", "nproc_per_node"),
    ],
)
def test_an_unknown_key_suggests_the_key_whose_words_or_flag_it_shares(
        typed: str, meant: str) -> None:
    assert suggestion(typed) == f"did you mean '{meant}' ({flag_name(meant)})?"


def test_a_key_with_nothing_in_common_suggests_nothing_and_lists_the_keys() -> None:
    assert suggestion("flux_capacitor").startswith("valid keys: entrypoint, args,")
    assert closest("flux_capacitor", {"max_restarts": ["--max-restarts"]}) is None


def test_one_shared_word_of_a_long_name_is_not_enough() -> None:
    assert closest("max_total_attempt_budget", {"max_restarts": ["--max-restarts"]}) is None


def test_every_keys_flag_is_one_trainguard_run_accepts() -> None:
    from trainguard.cli import parser

    run = parser()._subparsers._group_actions[0].choices["run"]  # type: ignore[union-attr]
    flags = {o for a in run._actions for o in a.option_strings}
    named = {k: flag_name(k).split("/")[-1] for k in FIELDS if k not in ("entrypoint", "args")}
    assert {k: f for k, f in named.items() if f not in flags} == {}
