"""The second labellings (tests/data/diagnosis/agreement/SET.yaml) name every case of their set
once, with a category and restart verdict the first labels could have, and the benchmark that
compares them runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trainguard.diagnosis.taxonomy import Category, RestartHelps

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "diagnosis"
FILES = sorted((DATA / "agreement").glob("*.yaml"))


def test_there_is_a_second_labelling() -> None:
    assert FILES, "tests/data/diagnosis/agreement holds no second labelling"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_a_second_labelling_names_every_case_of_its_set_once(path: Path) -> None:
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert doc["set"] == path.stem and doc["how"] and doc["labelled"]
    cases = {p.name for p in (DATA / path.stem).iterdir() if p.is_dir()}
    assert set(doc["labels"]) == cases
    for name, label in doc["labels"].items():
        assert label["category"] in {c.value for c in Category}, name
        assert label["restart_helps"] in {r.value for r in RestartHelps}, name
        assert label["why"].strip() and isinstance(label["thread_read"], bool), name


def test_the_benchmark_prints_agreement_per_set(tmp_path: Path) -> None:
    name = FILES[0].stem
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "label_agreement.py"),
                          "--json", name], capture_output=True, text=True, check=True,
                         timeout=300).stdout
    import json
    doc = json.loads(out)
    s = doc[name]
    n = sum(p.is_dir() for p in (DATA / name).iterdir())
    assert s["cases"] == n == doc["all"]["cases"]
    assert 0 < s["labellers_category"] <= n and s["undisputed_category_cases"] == \
        s["labellers_category"]


def test_adjudicated_labels_are_measured_when_a_set_has_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An adjudication that settles every disagreement the first labeller's way measures
    `diagnose` exactly as the first labels do."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import label_agreement as la

    name = FILES[0].stem
    (tmp_path / "adjudicated").mkdir()
    (tmp_path / f"{name}.yaml").write_bytes(FILES[0].read_bytes())
    firsts = {p.name: yaml.safe_load((p / "case.yaml").read_text())["label"]
              for p in (DATA / name).iterdir() if p.is_dir()}
    (tmp_path / "adjudicated" / f"{name}.yaml").write_text(yaml.safe_dump(
        {"set": name, "labels": firsts}))
    monkeypatch.setattr(la, "AGREEMENT", tmp_path)
    s = la.summary(la.compare(name))
    assert s["adjudicated_cases"] == s["cases"]
    assert s["tool_vs_adjudicated_category"] == s["tool_vs_first_category"]
    assert s["tool_vs_adjudicated_restart"] == s["tool_vs_first_restart"]
    del firsts[next(iter(firsts))]  # one case left out: refused, not measured on fewer
    (tmp_path / "adjudicated" / f"{name}.yaml").write_text(yaml.safe_dump(
        {"set": name, "labels": firsts}))
    with pytest.raises(SystemExit, match="must name every case once"):
        la.compare(name)
