"""The diagnosis of log snippets (issue 17's tuning rounds): each case of
tests/data/diagnosis/snippets.yaml is one log that `trainguard diagnose` must answer as the
case says. The fields are described at the top of that file; a case with a field this runner
does not know fails, so that no expectation is silently skipped."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.helpers import diagnose_text
from trainguard.diagnosis.taxonomy import Category, Diagnosis, RestartHelps

SNIPPETS = Path(__file__).resolve().parents[1] / "data" / "diagnosis" / "snippets.yaml"
CASES: list[dict[str, Any]] = yaml.safe_load(SNIPPETS.read_text(encoding="utf-8"))
NAMES = Counter(str(c.get("name")) for c in CASES)

ABOUT = {"name", "from", "log", "file"}
EXPECT = {"category", "category_not", "restart_helps", "restart_helps_not", "subcategory",
          "rule", "evidence", "evidence_text", "evidence_start", "evidence_end",
          "evidence_absent", "evidence_line", "culprit_rank", "isolate_node", "symptom",
          "advice", "confidence_max"}


def check(d: Diagnosis, case: dict[str, Any]) -> None:
    """Every expectation of `case` holds for `d` (whose deciding line diagnose_text checked)."""
    assert d.evidence is not None
    ev = d.evidence.text
    if "category" in case:
        assert d.category == Category(case["category"])
    if "category_not" in case:
        assert d.category != Category(case["category_not"])
    if "restart_helps" in case:
        assert d.restart_helps == RestartHelps(case["restart_helps"])
    if "restart_helps_not" in case:
        assert d.restart_helps != RestartHelps(case["restart_helps_not"])
    if "subcategory" in case:
        assert d.subcategory == case["subcategory"]
    if "rule" in case:
        assert d.rule == case["rule"]
    if "evidence" in case:
        assert case["evidence"] in ev
    if "evidence_text" in case:
        assert ev == case["evidence_text"]
    if "evidence_start" in case:
        assert ev.startswith(case["evidence_start"])
    if "evidence_end" in case:
        assert ev.endswith(case["evidence_end"])
    if "evidence_absent" in case:
        assert case["evidence_absent"] not in ev
    if "evidence_line" in case:
        want = case["evidence_line"]
        assert d.evidence.line in (want if isinstance(want, list) else [want])
    if "culprit_rank" in case:
        assert d.culprit.rank == case["culprit_rank"]
    if "isolate_node" in case:
        assert d.isolate_node is case["isolate_node"]
    if "symptom" in case:
        assert any(case["symptom"] in s.text for s in d.symptoms), [s.text for s in d.symptoms]
    if "advice" in case:
        assert case["advice"] in d.advice
    if "confidence_max" in case:
        assert d.confidence <= case["confidence_max"]


@pytest.mark.parametrize("case", CASES, ids=[str(c.get("name")) for c in CASES])
def test_snippet(tmp_path: Path, case: dict[str, Any]) -> None:
    unknown = set(case) - ABOUT - EXPECT
    assert not unknown, f"fields this runner does not know: {sorted(unknown)}"
    assert {"name", "from", "log"} <= set(case), "a case has a name, a source and a log"
    assert set(case) & EXPECT, "a case expects something of the answer"
    assert NAMES[case["name"]] == 1, "a case's name is its own"
    assert isinstance(case["log"], str)
    d = diagnose_text(tmp_path, case["log"], case.get("file", "console.log"))
    check(d, case)
