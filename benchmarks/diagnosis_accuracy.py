"""Accuracy of `trainguard diagnose` on the labelled corpus (tests/data/diagnosis).

    .venv/bin/python benchmarks/diagnosis_accuracy.py [--json] [--show-misses] [--corpus DIR]

The rules were written against tests/data/diagnosis/cases (the development corpus);
tests/data/diagnosis/heldout holds cases labelled blind and never tuned on:
`--corpus tests/data/diagnosis/heldout` measures how the rules generalise.

Runs the same code as `trainguard diagnose FILES...` on each case's log files and compares
category and restart verdict with the label decided by reading the thread.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

from trainguard.diagnosis.sources import diagnose_paths, scan_file
from trainguard.diagnosis.taxonomy import Diagnosis

CORPUS = Path(__file__).resolve().parents[1] / "tests" / "data" / "diagnosis" / "cases"


def restart_label(value: object) -> str:
    """YAML reads a bare yes/no as a boolean."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


# libyaml's safe loader where PyYAML has it: the 2,853 case files of the sets parse the same,
# in 0.3 s instead of 2.4 s (every test collection reads them)
_SAFE = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_cases(root: Path = CORPUS) -> list[dict[str, Any]]:
    cases = []
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        meta = yaml.load((d / "case.yaml").read_text(encoding="utf-8"), Loader=_SAFE)
        meta["dir"] = d
        meta["logs"] = sorted(d.glob("*.log"))
        cases.append(meta)
    return cases


def evaluate(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for c in cases:
        rep = diagnose_paths(c["logs"])
        d = rep.diagnosis
        lines = [(str(p), f.line) for p in c["logs"] for f in scan_file(p)]
        decided = (d.evidence.file, d.evidence.line) if d and d.evidence else None
        got = d.category.value if d else "other"
        got_restart = d.restart_helps.value if d else "maybe"
        label = c["label"]
        rows.append({
            "case": c["dir"].name, "source": c["source"],
            "want": label["category"], "got": got,
            "want_restart": restart_label(label["restart_helps"]), "got_restart": got_restart,
            "evidence": d.evidence.text[:160] if d and d.evidence else None,
            "layer": layer(d),
            # the deciding line is not the last error-looking line of the case
            "root_not_last": decided is not None and len(lines) > 1 and decided != lines[-1],
        })
    return rows


def layer(d: Diagnosis | None) -> str:
    """Which layer decided: the rules, a failure family, the learned model, the fallback's
    last error line (nothing supported more), or none (no answer)."""
    if d is None:
        return "none"
    if d.rule in ("model", "fallback"):
        return d.rule
    return "family" if (d.rule or "").startswith("family:") else "rules"


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    per: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for r in rows:
        p = per[r["want"]]
        p[0] += 1
        p[1] += r["got"] == r["want"]
        p[2] += r["got_restart"] == r["want_restart"]
    n = len(rows)
    return {
        "cases": n,
        "category_accuracy": sum(r["got"] == r["want"] for r in rows) / n,
        "restart_accuracy": sum(r["got_restart"] == r["want_restart"] for r in rows) / n,
        "root_not_last": sum(r["root_not_last"] for r in rows),
        "layers": {k: {"cases": sum(r["layer"] == k for r in rows),
                       "category_ok": sum(r["layer"] == k and r["got"] == r["want"]
                                          for r in rows)}
                   for k in ("rules", "family", "model", "fallback", "none")},
        "per_category": {k: {"cases": v[0], "category_ok": v[1], "restart_ok": v[2]}
                         for k, v in sorted(per.items())},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--show-misses", action="store_true")
    ap.add_argument("--corpus", type=Path, default=CORPUS, help="a directory of case dirs")
    args = ap.parse_args()
    rows = evaluate(load_cases(args.corpus))
    s = summarize(rows)
    if args.json:
        print(json.dumps({"summary": s, "cases": rows}, indent=2))
        return 0
    print("| category | cases | category correct | restart verdict correct |")
    print("| --- | ---: | ---: | ---: |")
    for k, v in s["per_category"].items():
        print(f"| {k} | {v['cases']} | {v['category_ok']} ({v['category_ok'] / v['cases']:.0%}) "
              f"| {v['restart_ok']} ({v['restart_ok'] / v['cases']:.0%}) |")
    print(f"| **all** | {s['cases']} | {s['category_accuracy']:.1%} | "
          f"{s['restart_accuracy']:.1%} |")
    print("\nDecided by: " + ", ".join(
        f"{k} {v['cases']} ({v['category_ok']} right)" for k, v in s["layers"].items()))
    print(f"In {s['root_not_last']} of {s['cases']} cases the deciding line is not the last "
          "error-looking line of the logs.")
    if args.show_misses:
        for r in rows:
            if r["got"] != r["want"] or r["got_restart"] != r["want_restart"]:
                print(f"MISS {r['case']}: want {r['want']}/{r['want_restart']} got "
                      f"{r['got']}/{r['got_restart']}  <- {r['evidence']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
