"""Wire one single-node job: job dir, store, node agent, controller. Returns the exit code."""

from __future__ import annotations

import sys
from pathlib import Path

from trainguard.agent import ConsoleOptions, NodeAgent
from trainguard.controller import Controller, console_printer
from trainguard.paths import JobPaths
from trainguard.spec import JobSpec
from trainguard.store import JobStore


def launch(spec: JobSpec, argv: list[str], marker: str) -> int:
    paths = JobPaths.for_spec(spec, Path.cwd())
    paths.make()
    filt = frozenset(spec.local_ranks_filter) if spec.local_ranks_filter is not None else None
    with JobStore.create(paths.job_dir, spec.run_id) as store:
        agent = NodeAgent("node-0", sys.stdout, ConsoleOptions(spec.redirects, filt),
                          spec.step_pattern, marker)
        controller = Controller(spec, paths, store, agent, argv, on_event=console_printer())
        code = controller.run()
    print(f"[trainguard] job dir: {paths.job_dir}  (trainguard recovery {paths.job_dir})",
          file=sys.stderr, flush=True)
    return code
