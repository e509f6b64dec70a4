"""`python -m trainguard.node.guardian MARKER`: kills a dead launcher's workers.

Reads `+PGID` / `-PGID` / `=PATH` lines on stdin. On `exit` it leaves quietly; on end of
input without `exit` (the launcher died, even by SIGKILL) it SIGKILLs every group it still
knows, then every process whose environment carries TRAINGUARD_MARKER=MARKER (workers'
children that left their group), then frees every shared-memory region (`=PATH`).
Standard library and psutil only; ignores SIGINT/SIGTERM so it outlives the launcher long
enough to clean up.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys

from trainguard.checkpoint.memory_format import free_region
from trainguard.node.procs import kill_marked


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    marker = argv[1] if len(argv) > 1 else ""
    groups: set[int] = set()
    regions: list[str] = []
    for raw in sys.stdin:
        line = raw.strip()
        if line == "exit":
            return 0
        if line.startswith("="):
            regions.append(line[1:])
        if line[:1] in "+-" and line[1:].isdigit():
            (groups.add if line[0] == "+" else groups.discard)(int(line[1:]))
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    if marker:
        kill_marked(marker)
    for path in regions:  # after the workers: none writes into it any more
        free_region(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
