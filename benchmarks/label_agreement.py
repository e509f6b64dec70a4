"""How often two careful labellers agree on the corpus's labels, and where `diagnose` stands.

    .venv/bin/python benchmarks/label_agreement.py [--json] [--show-disagreements] [SET...]

A set's labels (tests/data/diagnosis/SET/*/case.yaml, the first labeller's) are compared with
a second labeller's, made independently: tests/data/diagnosis/agreement/SET.yaml, written by
someone who read each case's logs and its thread (only the URL and title were given, under a
neutral case name) and never saw the first labels, the rules or the tool's answers. Printed
per set, and over every set given (default: every set with a second labelling):

* agreement between the two labellers: category, restart verdict, both;
* `diagnose` (the same code as benchmarks/diagnosis_accuracy.py) against the first labels
  (the figure docs/diagnosis.md reports), against the second, and on the cases where the two
  labellers agree (the labels nobody disputes);
* where a third reader settled the disagreements (agreement/adjudicated/SET.yaml, every case:
  the agreed labels and the adjudicated ones), `diagnose` against those labels too.

The agreement between two people is the ceiling of what any figure measured against one of
them can mean: a tool right 100% of the time by one labeller's reading is right only as often
as the two agree by the other's.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml
from diagnosis_accuracy import evaluate, load_cases, restart_label

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "diagnosis"
AGREEMENT = DATA / "agreement"


def second_labels(name: str, folder: Path = AGREEMENT) -> dict[str, dict[str, Any]]:
    """The second labelling of set `name` (or, with folder AGREEMENT / "adjudicated", the
    adjudicated one): case dir name -> {category, restart_helps, why, ...}."""
    doc = yaml.safe_load((folder / f"{name}.yaml").read_text(encoding="utf-8"))
    return dict(doc["labels"])


def compare(name: str) -> list[dict[str, Any]]:
    """One row per case of set `name`: both labels and `diagnose`'s answer."""
    second = second_labels(name)
    cases = load_cases(DATA / name)
    missing = sorted({c["dir"].name for c in cases} ^ set(second))
    if missing:
        raise SystemExit(f"{AGREEMENT / name}.yaml and {DATA / name} differ in cases: "
                         f"{missing[:5]}; the second labelling must name every case once")
    settled = (second_labels(name, AGREEMENT / "adjudicated")
               if (AGREEMENT / "adjudicated" / f"{name}.yaml").is_file() else {})
    if settled and set(settled) != set(second):
        raise SystemExit(f"the adjudicated labels of {name} must name every case once")
    rows = []
    for row in evaluate(cases):
        b = second[row["case"]]
        c = settled.get(row["case"])
        rows.append({**row, "second": b["category"],
                     "second_restart": restart_label(b["restart_helps"]),
                     "second_why": b.get("why", ""),
                     "settled": c["category"] if c else None,
                     "settled_restart": restart_label(c["restart_helps"]) if c else None})
    return rows


def _share(n: int, of: int) -> str:
    return f"{n}/{of} ({n / of:.1%})" if of else "-"


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(rows)
    cat = [r for r in rows if r["want"] == r["second"]]
    rst = [r for r in rows if r["want_restart"] == r["second_restart"]]
    return {
        "cases": n,
        "labellers_category": len(cat), "labellers_restart": len(rst),
        "labellers_both": sum(r["want"] == r["second"] and r["want_restart"] == r["second_restart"]
                              for r in rows),
        "tool_vs_first_category": sum(r["got"] == r["want"] for r in rows),
        "tool_vs_first_restart": sum(r["got_restart"] == r["want_restart"] for r in rows),
        "tool_vs_second_category": sum(r["got"] == r["second"] for r in rows),
        "tool_vs_second_restart": sum(r["got_restart"] == r["second_restart"] for r in rows),
        "undisputed_category_cases": len(cat),
        "tool_on_undisputed_category": sum(r["got"] == r["want"] for r in cat),
        "undisputed_restart_cases": len(rst),
        "tool_on_undisputed_restart": sum(r["got_restart"] == r["want_restart"] for r in rst),
        "adjudicated_cases": len(settled := [r for r in rows if r["settled"] is not None]),
        "tool_vs_adjudicated_category": sum(r["got"] == r["settled"] for r in settled),
        "tool_vs_adjudicated_restart": sum(r["got_restart"] == r["settled_restart"]
                                           for r in settled),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sets", nargs="*", help="set names (default: every agreement/*.yaml)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--show-disagreements", action="store_true")
    args = ap.parse_args()
    names = args.sets or sorted(p.stem for p in AGREEMENT.glob("*.yaml"))
    if not names:
        print(f"no second labelling under {AGREEMENT}", file=sys.stderr)
        return 2
    per = {name: compare(name) for name in names}
    every = [r for rows in per.values() for r in rows]
    sums = {**{name: summary(rows) for name, rows in per.items()}, "all": summary(every)}
    if args.json:
        print(json.dumps(sums, indent=2))
        return 0
    print("| set | cases | labellers agree: category | restart verdict | both "
          "| diagnose vs first labels: category | restart | vs second: category | restart "
          "| diagnose where the labellers agree: category | restart |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, s in sums.items():
        n = s["cases"]
        print(f"| {'**all**' if name == 'all' else f'`{name}/`'} | {n} "
              f"| {_share(s['labellers_category'], n)} | {_share(s['labellers_restart'], n)} "
              f"| {_share(s['labellers_both'], n)} "
              f"| {_share(s['tool_vs_first_category'], n)} "
              f"| {_share(s['tool_vs_first_restart'], n)} "
              f"| {_share(s['tool_vs_second_category'], n)} "
              f"| {_share(s['tool_vs_second_restart'], n)} "
              f"| {_share(s['tool_on_undisputed_category'], s['undisputed_category_cases'])} "
              f"| {_share(s['tool_on_undisputed_restart'], s['undisputed_restart_cases'])} |")
    for name, s in sums.items():
        if s["adjudicated_cases"] and name != "all":
            n = s["adjudicated_cases"]
            print(f"\n`{name}/` against the adjudicated labels: category "
                  f"{_share(s['tool_vs_adjudicated_category'], n)}, restart verdict "
                  f"{_share(s['tool_vs_adjudicated_restart'], n)}")
    if args.show_disagreements:
        for name, rows in per.items():
            for r in rows:
                if r["want"] != r["second"]:
                    print(f"{name}/{r['case']}: first {r['want']}, second {r['second']}, "
                          f"diagnose {r['got']}  ({r['second_why'][:140]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
