"""Every benchmark script still imports and parses its flags (`--help`): they run by hand or
in `make bench`, not in `make test`, and one had rotted unseen (review 41: scale_agents.py
imported `connect` from where it no longer was, and set fleet attributes that were gone)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHECK = """
import os, runpy, sys
sys.path.insert(0, os.path.dirname(sys.argv[1]))  # as `python benchmarks/X.py` has it
for path in sys.argv[1:]:
    sys.argv = [path, "--help"]
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        if e.code not in (0, None):
            raise
    else:
        raise SystemExit(path + " ran without exiting on --help")
"""


def test_every_benchmark_script_imports_and_takes_help() -> None:
    scripts = sorted(str(p) for p in (ROOT / "benchmarks").glob("*.py")
                     if not p.name.startswith("_"))
    assert len(scripts) >= 10
    r = subprocess.run([sys.executable, "-c", CHECK, *scripts], capture_output=True,
                       text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
