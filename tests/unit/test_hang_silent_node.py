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


def test_a_hang_is_not_confirmed_while_every_stuck_rank_s_node_agent_is_silent(
        tmp_path: Path) -> None:
    """Walk-through 36 #12: every agent's link cut (a controller-side outage, a full
    disruption whose rule waits 120 s): the hang was confirmed after 80 s, the multi-node
    preset restarted, and the restart failed the job, while the ranks trained on. The
    nodes' loss decides (the node timeout, the disruption's wait), never a hang."""
    from trainguard.hang.detector import HangState, HangVerdict

    spec = build_spec(None, {"entrypoint": "train.py", "run_id": "r", "nnodes": 2})
    paths = JobPaths(tmp_path / "job", tmp_path / "job" / "logs", tmp_path / "job" / "ck")
    paths.make()
    rec = Recorder(spec, paths, JobStore.create(paths.job_dir, "r"), ["train.py"])
    silent = {"node-0": 80.0, "node-1": 80.0}

    class NoStacks:
        def dump_stacks(self, cmd: object) -> list[object]:
            return []

    watch = HangWatch(rec, NoStacks(), lambda: silent)  # type: ignore[arg-type]
    report = NodeReport(node="cluster", attempt=0, at=utcnow(), progress=Progress(), workers=[
        WorkerFact(rank=r, node=f"node-{r}", local_rank=0, pid=100 + r,
                   state=WorkerState.RUNNING) for r in (0, 1)])
    confirmed = HangVerdict(HangState.CONFIRMED, (0, 1), utcnow(), 80.0, 8.0, None, "test")
    watch.detector.observe = lambda *a, **k: confirmed  # type: ignore[method-assign]
    assert watch.observe(report) is None and watch.confirmed is None
    silent["node-0"] = 0.2  # one heard again, its report's progress not merged yet: still
    assert watch.observe(report) is None  # one node unheard, no confirmation (review 40 #6)
    silent.update({"node-0": 0.3, "node-1": 0.3})  # heard again, and still no progress
    assert watch.observe(report) is not None
