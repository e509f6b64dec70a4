"""The step ledger's samples (Recorder._sample) from the fleet's merged reports: pure, over a
real job store."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

from trainguard.controller.merger import Merger
from trainguard.controller.recorder import Recorder
from trainguard.controller.store import JobStore
from trainguard.goodput.ledger import Attempt, Goodput, LedgerInput, account
from trainguard.paths import JobPaths
from trainguard.protocol import NodeReport, Progress, WorkerFact
from trainguard.spec_build import build_spec
from trainguard.states import WorkerState

T = datetime(2026, 12, 5, 13, tzinfo=timezone.utc)


def report(node: str, rank: int, first: tuple[int, float], last: tuple[int, float]
           ) -> NodeReport:
    return NodeReport(node=node, attempt=0, at=T, workers=[WorkerFact(
        rank=rank, node=node, local_rank=0, pid=100 + rank, state=WorkerState.RUNNING)],
        progress=Progress(first_step=first[0], first_step_at=T + timedelta(seconds=first[1]),
                          last_step=last[0], last_step_at=T + timedelta(seconds=last[1])))


def recorder(tmp_path: Path) -> tuple[Recorder, JobStore]:
    """A job's recorder over a real job store in `tmp_path`."""
    spec = build_spec(None, {"entrypoint": "train.py", "run_id": "r"})
    paths = JobPaths(tmp_path / "job", tmp_path / "job" / "logs", tmp_path / "job" / "ck")
    paths.make()
    store = JobStore.create(paths.job_dir, "r")
    return Recorder(spec, paths, store, ["train.py"]), store


def ledger(store: JobStore, end_s: float) -> Goodput:
    t0 = T.timestamp()
    return account(LedgerInput(start=t0, end=t0 + end_s, attempts=[Attempt(0, t0, None, True)],
                               samples=store.progress()))


def test_the_same_start_seen_by_two_nodes_is_one_sample_not_a_step_done_again(
        tmp_path: Path) -> None:
    """Walk-through 26: a 2-node job that redid 10 steps read `done again 13`: node-1's report
    came first, node-0's first step (3 ms earlier) moved the merged first step back, and the
    recorder sampled the start twice (steps 111, 112, 111, 112): the ledger saw the steps
    go back, twice."""
    rec, store = recorder(tmp_path)
    merger = Merger()
    merger.new_attempt(0)
    placement = ["node-0", "node-1"]
    merger.fold("node-1", [report("node-1", 1, (111, 0.003), (112, 0.103))])
    rec.sync(merger.merged(placement, {}, set(placement)), force=True)
    merger.fold("node-0", [report("node-0", 0, (111, 0.0), (112, 0.1))])
    merger.fold("node-1", [report("node-1", 1, (111, 0.003), (120, 0.9))])
    rec.sync(merger.merged(placement, {}, set(placement)), force=True)
    assert [s for _, s, _ in store.progress()] == [111, 112, 120]
    g = ledger(store, 2.0)
    assert (g.steps_productive, g.steps_wasted) == (10, 0)


def test_an_in_process_restart_is_a_new_start_of_the_attempt(tmp_path: Path) -> None:
    rec, store = recorder(tmp_path)
    rec.sync(report("node-0", 0, (1, 0.0), (20, 2.0)), force=True)
    rec.sync(report("node-0", 0, (16, 3.0), (25, 4.0)), force=True)  # back to step 15
    assert [s for _, s, _ in store.progress()] == [1, 20, 16, 25]
    g = ledger(store, 5.0)
    assert g.steps_wasted == 5  # steps 16-20, done twice


def test_steps_trained_while_no_controller_watched_count_from_the_kept_commits() -> None:
    """Walk-through 26: the launcher SIGKILLed at step 43, the ranks trained on to 150 and
    committed checkpoints the agents handed to the next controller; the job succeeded and
    read `last progress: step 43`, goodput 13.5%, 43 steps done."""
    from trainguard.controller.shown import last_progress
    from trainguard.goodput.read import Save, ledger_input
    from trainguard.records import RunningRecord, StartType, iso

    t0 = T.timestamp()
    samples = [(0, s, t0 + s * 0.1) for s in range(1, 44)]
    commits = [Save(t0 + s * 0.1 + 0.05, 0, s, 0.01, 0.0, False, False)
               for s in range(50, 151, 50)]
    end = T + timedelta(seconds=16)
    attempt = RunningRecord(0, T, StartType.FIRST_START, end_at=end, end_reason="succeeded")
    g = account(ledger_input({"created_at": iso(T), "state": "succeeded",
                              "ended_at": iso(end)}, [attempt], samples,
                             commits, [], None, T + timedelta(seconds=16)))
    assert g.steps_productive == 150 and g.steps_wasted == 0
    meta = {"last_step": 43, "last_progress_at": iso(T + timedelta(seconds=4.3))}
    assert last_progress(meta, (150, iso(T + timedelta(seconds=15))))["step"] == 150
    assert last_progress(meta, (40, iso(T + timedelta(seconds=4)))) == {
        "step": 43, "time": meta["last_progress_at"], "source": "step"}


def test_a_controller_that_took_over_does_not_sample_the_attempt_s_start_again(
        tmp_path: Path) -> None:
    """Walk-through 26: after each takeover the job read `done again 1` with no restart: the
    new controller sampled the attempt's first step again, as the first node to report saw
    it (3 ms after the first sample), and the ledger read the steps going back."""
    from trainguard.records import RunningRecord, StartType

    spec = build_spec(None, {"entrypoint": "train.py", "run_id": "r"})
    paths = JobPaths(tmp_path / "job", tmp_path / "job" / "logs", tmp_path / "job" / "ck")
    paths.make()
    store = JobStore.create(paths.job_dir, "r")
    t0 = T.timestamp()
    store.put_running(RunningRecord(0, T, StartType.FIRST_START))
    store.set_meta(attempt=0, state="running", launches=1)
    store.add_progress([(0, 1, t0), (0, 50, t0 + 5.0)])  # the dead controller's samples
    rec = Recorder(spec, paths, store, ["train.py"])
    assert rec.adopt() == 0
    rec.sync(report("node-1", 1, (1, 0.003), (60, 6.0)), force=True)
    assert [s for _, s, _ in store.progress()] == [1, 50, 60]
    g = ledger(store, 7.0)
    assert (g.steps_productive, g.steps_wasted) == (60, 0)


def test_an_attempt_s_last_sample_is_its_newest_not_another_attempt_s(tmp_path: Path) -> None:
    store = JobStore.create(tmp_path / "job", "r")
    assert store.last_sample(0) is None
    t0 = T.timestamp()
    store.add_progress([(0, 1, t0), (0, 50, t0 + 5.0), (1, 41, t0 + 9.0), (1, 45, t0 + 9.0)])
    assert store.last_sample(0) == (0, 50, t0 + 5.0)
    assert store.last_sample(1) == (1, 45, t0 + 9.0)  # same instant: the later row
    assert store.last_sample(2) is None


def test_steps_a_full_disk_held_back_are_written_at_the_job_s_end(tmp_path: Path) -> None:
    """Walk-through 37 #7: after the job-dir disk filled up the step ledger was never written
    again (the job's end wrote its events from the room kept, not the samples): `report`
    counted 140 of 250 steps done once and none done again, and the meta's last step was
    step 45's. The samples and the last step wait, and go with the job's end."""
    from trainguard.errors import StoreError
    from trainguard.states import JobState

    rec, store = recorder(tmp_path)
    rec.sync(report("node-0", 0, (1, 0.0), (40, 4.0)), force=True)
    full = True
    real_add, real_meta = store.add_progress, store.set_meta

    def add_progress(samples: list[tuple[int, int, float]]) -> None:
        if full:
            raise StoreError("database or disk is full")
        real_add(samples)

    def set_meta(**values: object) -> None:
        if full and "last_step" in values:
            raise StoreError("database or disk is full")
        real_meta(**values)

    store.add_progress = add_progress  # type: ignore[method-assign]
    store.set_meta = set_meta  # type: ignore[method-assign]
    rec.sync(report("node-0", 0, (1, 0.0), (150, 15.0)), force=True)
    rec.sync(report("node-0", 0, (141, 16.0), (250, 26.0)), force=True)  # restarted in place
    assert [s for _, s, _ in store.progress()] == [1, 40]
    full = False  # the end: the room kept for it
    rec.end_job(JobState.SUCCEEDED, 0, "done", attempt=0)
    assert [s for _, s, _ in store.progress()] == [1, 40, 150, 141, 250]
    assert store.meta()["last_step"] == 250
    g = ledger(store, 27.0)
    assert (g.steps_productive, g.steps_wasted) == (250, 10)


def test_thinning_the_waiting_samples_keeps_where_each_stretch_began_and_ended() -> None:
    """Review 43 #10: every other sample went, an attempt's first among them."""
    from trainguard.controller.progress_ledger import thinned

    samples = [(0, s, float(s)) for s in range(1, 8)] + [(0, 4, 8.0), (0, 5, 9.0),
                                                         (1, 3, 10.0), (1, 4, 11.0)]
    kept = thinned(samples)
    assert {(0, 7, 7.0), (0, 4, 8.0), (0, 5, 9.0), (1, 3, 10.0), (1, 4, 11.0)} <= set(kept)
    assert len(kept) < len(samples) and kept == sorted(kept, key=lambda x: x[2])
