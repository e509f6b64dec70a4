"""The controller's own stall (controller/stall.py): a launcher stopped or starved says so,
and hang detection does not blame the nodes for the silence (walk-through 36 #8: a
16 s SIGSTOP gave `HangSuspected: ... the agent of node-0, node-1 has been silent`)."""

from __future__ import annotations

import time
from pathlib import Path

from trainguard.controller.hang_watch import HangWatch
from trainguard.controller.recorder import Recorder
from trainguard.controller.stall import TICK_S, ControllerStall, caught_up
from trainguard.controller.store import JobStore
from trainguard.hang.detector import HangState, HangVerdict
from trainguard.paths import JobPaths
from trainguard.protocol import NodeReport, Progress, WorkerFact
from trainguard.records import utcnow
from trainguard.spec_build import build_spec
from trainguard.states import WorkerState


def test_the_nodes_are_current_again_once_each_was_heard_after_the_stall() -> None:
    assert not caught_up(0.1, {"a": 0.05}, 0.25)  # a report interval first
    assert not caught_up(1.0, {"a": 0.5, "b": 17.0}, 0.25)  # b not heard since
    assert caught_up(1.0, {"a": 0.5, "b": 0.2}, 0.25)
    assert caught_up(3.3, {"a": 0.5, "b": 20.0}, 0.25)  # b silent in its own right


def test_a_stalled_controller_says_so_and_suspects_no_hang_until_the_nodes_are_heard(
        tmp_path: Path) -> None:
    spec = build_spec(None, {"entrypoint": "train.py", "run_id": "r", "nnodes": 2})
    paths = JobPaths(tmp_path / "job", tmp_path / "job" / "logs", tmp_path / "job" / "ck")
    paths.make()
    store = JobStore.create(paths.job_dir, "r")
    rec = Recorder(spec, paths, store, ["train.py"])
    silent = {"node-0": 0.2, "node-1": 0.2}
    now, read = [100.0], [0]

    def clock() -> float:
        read[0] += 1
        return now[0]

    def wait_for_reads(n: int) -> None:
        deadline = time.monotonic() + 10
        while read[0] < n and time.monotonic() < deadline:
            time.sleep(0.01)

    watch = HangWatch(rec, None, lambda: silent)  # type: ignore[arg-type]
    watch.stall = ControllerStall(rec, lambda: silent, clock=clock)
    suspected = HangVerdict(HangState.SUSPECTED, (0, 1), utcnow(), 16.3, 8.0, None, "test")
    watch.detector.observe = lambda *a, **k: suspected  # type: ignore[method-assign]
    report = NodeReport(node="cluster", attempt=0, at=utcnow(), progress=Progress(), workers=[
        WorkerFact(rank=r, node=f"node-{r}", local_rank=0, pid=100 + r,
                   state=WorkerState.RUNNING) for r in (0, 1)])
    try:
        assert not watch.stall.holds(0)  # the ticker starts
        wait_for_reads(1)  # its first beat
        now[0] += 16.3  # the launcher SIGSTOPped: its ticker's next beat is 16 s late
        silent.update({"node-0": 16.3, "node-1": 16.3})
        wait_for_reads(2)
        time.sleep(TICK_S / 5)  # (the late beat noted)
        assert watch.observe(report) is None
        reasons = [e.reason for _, e in store.events()]
        assert "ControllerStalled" in reasons and "HangSuspected" not in reasons
        stalled = store.events(reasons=("ControllerStalled",))[0][1]
        assert "did not run for 16.3s" in stalled.message
        now[0] += 1.0  # the backlog read, each node's report came: judged again
        silent.update({"node-0": 0.1, "node-1": 0.1})
        watch.observe(report)
        assert len(store.events(reasons=("HangSuspected",))) == 1
        assert len(store.events(reasons=("ControllerStalled",))) == 1
    finally:
        watch.stall.close()
