"""A suspected hang whose stuck ranks' node agent is silent (controller/hang_watch.py):
said as what is known, over a real job store."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from trainguard.controller.hang_watch import SUSPENDED, HangWatch
from trainguard.controller.recorder import Recorder
from trainguard.controller.store import JobStore
from trainguard.paths import JobPaths
from trainguard.protocol import NodeReport, Progress, WorkerFact
from trainguard.records import utcnow
from trainguard.spec_build import build_spec
from trainguard.states import WorkerState


def test_a_rank_whose_node_agent_is_silent_is_not_said_to_be_suspended(tmp_path: Path) -> None:
    """Walk-through 26: node-1's agent SIGSTOPped for 6 s gave 'your training job may be
    suspended ... rank 1' while rank 1 trained on (rank 0's log kept moving with it)."""
    spec = build_spec(None, {"entrypoint": "train.py", "run_id": "r", "nnodes": 2})
    paths = JobPaths(tmp_path / "job", tmp_path / "job" / "logs", tmp_path / "job" / "ck")
    paths.make()
    rec = Recorder(spec, paths, JobStore.create(paths.job_dir, "r"), ["train.py"])
    silent = {"node-0": 0.4, "node-1": 5.3}
    watch = HangWatch(rec, None, lambda: silent)  # type: ignore[arg-type]
    report = NodeReport(node="cluster", attempt=0, at=utcnow(), progress=Progress(), workers=[
        WorkerFact(rank=r, node=f"node-{r}", local_rank=0, pid=100 + r,
                   state=WorkerState.RUNNING) for r in (0, 1)])
    v = SimpleNamespace(stuck_ranks=[1], idle_s=5.3, describe=lambda: "no progress for 5.3s")
    said = watch.suspected(v, report)  # type: ignore[arg-type]
    assert said == ("no progress heard from rank(s) 1 for 5.3s: the agent of node-1 has been "
                    "silent for 5.3s, so nobody could report it (the ranks may be training); a "
                    "node is lost after 10s of silence"), said
    silent["node-1"] = 0.5  # heard: the rank itself stopped making progress
    assert watch.suspected(v, report).startswith(SUSPENDED)  # type: ignore[arg-type]
