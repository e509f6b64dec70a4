"""A value out of range, or of the wrong kind, is said in trainguard's words with the fix,
not in the validation library's (`Input should be less than or equal to 128`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from trainguard.cli import main
from trainguard.spec import JobSpec
from trainguard.spec_words import plain


def first_error(**fields: Any) -> Any:
    with pytest.raises(ValidationError) as e:
        JobSpec(**{"entrypoint": "t.py", **fields})
    return e.value.errors()[0]


@pytest.mark.parametrize(("fields", "problem", "want"), [
    ({"max_restarts": 200}, "200 is more than 128, the most allowed", "128 or less"),
    ({"grace_period_s": -1.0}, "-1 is negative", "0 or more"),
    ({"nproc_per_node": 0}, "0 is less than 1, the least allowed", "1 or more"),
    ({"hang_timeout_s": 0.0}, "0 is too small: it must be more than 0", "more than 0"),
    ({"max_restarts": "x"}, "'x' is not a whole number", "a whole number"),
    ({"grace_period_s": "soon"}, "'soon' is not a number", "a number"),
    ({"precheck": "maybe"}, "'maybe' is not true or false", "true or false"),
    ({"backend": "k8s"}, "'k8s' is not one of local or slurm", "one of local or slurm"),
    ({"no_such": 1}, "is not a setting trainguard knows", None),
])
def test_each_common_error_type_reads_as_a_plain_sentence(
        fields: dict[str, Any], problem: str, want: str | None) -> None:
    assert plain(first_error(**fields)) == (problem, want)


def test_a_missing_field_is_required() -> None:
    with pytest.raises(ValidationError) as e:
        JobSpec()  # type: ignore[call-arg]
    assert plain(e.value.errors()[0]) == ("is required", None)


@pytest.mark.parametrize(("text", "said"), [
    ("max_restarts: 200\n", "max_restarts: 200 is more than 128, the most allowed. Fix: set "
     "--max-restarts / 'max_restarts' to 128 or less (this value came from the job file "),
    ("grace_period_s: -1\n", "grace_period_s: -1 is negative. Fix: set --grace-period / "
     "'grace_period_s' to 0 or more (this value came from the job file "),
])
def test_a_job_file_value_out_of_range_says_the_most_or_least_allowed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, said: str) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(text, encoding="utf-8")
    assert main(["run", "--dry-run", "--config", str(path), "t.py"]) == 2
    err = capsys.readouterr().err
    assert said in err and "Input should" not in err, err
