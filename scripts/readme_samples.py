"""Rewrite the README's sample output from a real run of `make demo`: never typed by hand.

    .venv/bin/python scripts/readme_samples.py [--readme README.md]

Runs examples/demo.py (the job that survives three injected faults), keeps the launcher's
`[trainguard]` lines and the read commands' output (workers' own lines left out), cuts lines
longer than WIDTH with ` ...`, and puts the result between the README's
`<!-- demo-output:start -->` and `<!-- demo-output:end -->` markers, with the date of the run.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- demo-output:start -->", "<!-- demo-output:end -->"
WIDTH = 200
_RANK_LINE = re.compile(r"^\[rank \d+\]")


def sample(output: str) -> str:
    """The lines worth showing: launcher events and the read commands but `events` (the
    launcher's lines already show them), not the ranks' own lines."""
    kept: list[str] = []
    skipping = False
    for line in output.splitlines():
        if line.startswith("$ trainguard "):
            skipping = line.startswith("$ trainguard events ")
        if skipping or _RANK_LINE.match(line) or line.startswith("$ TRAINGUARD_FAULT"):
            continue
        kept.append(line if len(line) <= WIDTH else line[: WIDTH - 4] + " ...")
    return "\n".join(kept).strip("\n")


def rewrite(readme: str, body: str, when: str) -> str:
    """`readme` with the block between the markers replaced by `body`."""
    if START not in readme or END not in readme:
        raise SystemExit(f"README has no {START} ... {END} block to rewrite")
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    block = (f"{START}\nFrom one run of `make demo` on {when} (rewritten by "
             f"`scripts/readme_samples.py`; long lines cut with `...`; the ranks' own lines, "
             f"the run command and the `events` table left out: the launcher's lines show the "
             f"same events):\n\n```\n{body}\n```\n")
    return head + block + END + tail


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--readme", type=Path, default=ROOT / "README.md")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tg-readme-") as tmp:
        env = dict(os.environ, DEMO_JOB_DIR=str(Path(tmp) / "demo"))
        run = subprocess.run([sys.executable, str(ROOT / "examples" / "demo.py")], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             timeout=600, check=False)
    if run.returncode != 0:
        sys.stderr.write(run.stdout[-3000:])
        raise SystemExit(f"the demo failed (exit {run.returncode}); README left as it was")
    body = sample(run.stdout)  # stdout and stderr together, in the order printed
    text = args.readme.read_text()
    args.readme.write_text(rewrite(text, body, date.today().isoformat()))
    print(f"rewrote the demo output in {args.readme} ({len(body.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
