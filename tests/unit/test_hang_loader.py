"""A silent evaluation over a DataLoader is not a hang (walk-through 28, finding 9): its main
thread waits in the loader for each batch, at one place every look, while the loader's worker
processes produce. The batches arrive as reads of the rank's own process; a loader whose
workers are stuck or dead hands over nothing, and its rank is confirmed hung as before."""

from __future__ import annotations

import os
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tests.unit.helpers import NO_STEPS, fake_hang_watch
from trainguard.hang.detector import HangDetector, HangPolicy, HangState
from trainguard.node.liveness import _tree_usage
from trainguard.protocol import FrameMsg, RankLiveness, StackDump, ThreadMsg

T0 = datetime(2026, 12, 5, tzinfo=timezone.utc)
TORCH = "/venv/lib/python3.11/site-packages/torch/"
LOADER = [("_try_get_data", f"{TORCH}utils/data/dataloader.py", 1133),
          ("_get_data", f"{TORCH}utils/data/dataloader.py", 1294),
          ("_next_data", f"{TORCH}utils/data/dataloader.py", 1332),
          ("__next__", f"{TORCH}utils/data/dataloader.py", 631), ("evaluate", "train.py", 30),
          ("<module>", "train.py", 44)]
WAIT = [("wait", f"{TORCH}distributed/distributed_c10d.py", 3000), ("<module>", "train.py", 20)]


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def sample(reads: int | None, t: float) -> RankLiveness:
    return RankLiveness(rank=0, last_step=20, last_progress_at=at(0), reads=reads,
                        sampled_at=at(t))


def test_the_detector_keeps_between_which_samples_the_reads_rose_last() -> None:
    det = HangDetector()
    det.start_attempt(at(0))
    det.observe([sample(100, 1)], at(1))
    assert det.reads_rose(0) is None  # one sample: nothing to compare with
    det.observe([sample(130, 2)], at(2))
    assert det.reads_rose(0) == (at(1), at(2))
    det.observe([sample(130, 3)], at(3))
    det.observe([sample(None, 4)], at(4))  # not sampled (a node without the field)
    assert det.reads_rose(0) == (at(1), at(2))
    det.observe([sample(131, 5)], at(5))
    assert det.reads_rose(0) == (at(4), at(5))
    assert det.reads_rose(7) is None  # a rank never seen
    det.start_attempt(at(6))  # a new attempt: its ranks start unread
    assert det.reads_rose(0) is None


def dump(frames: list[tuple[str, str, int]]) -> StackDump:
    return StackDump(rank=0, pid=100, threads=[ThreadMsg(thread_id=100, name="MainThread",
                     frames=[FrameMsg(name=n, filename=f, line=line) for n, f, line in frames])])


def watch(tmp_path: Path, looks: list[Any], rose: tuple[float, float]
          ) -> tuple[Any, list[str], list[Any]]:
    """A watch over a fake detector (suspected, then confirmed at every poll) whose rank 0's
    reads last rose between samples `rose` seconds after T0 (the first report's time)."""
    said: list[str] = []
    moved: list[Any] = []
    seen = iter(looks)
    w = fake_hang_watch(
        [HangState.SUSPECTED, *[HangState.CONFIRMED] * 8], said,
        SimpleNamespace(dump_stacks=lambda cmd: [dump(next(seen))]), str(tmp_path),
        policy=HangPolicy(), seen_working=lambda ranks, now: moved.append(dict(ranks)) or True,
        reads_rose=lambda rank: (at(rose[0]), at(rose[1])))
    return w, said, moved


def report(t: float) -> Any:
    return SimpleNamespace(at=at(t), liveness=[], progress=NO_STEPS, workers=[])


def observe(w: Any, times: list[float]) -> Any:
    """The first confirmation of polls at `times` (seconds after T0)."""
    confirmed = None
    for t in times:
        confirmed = confirmed or w.observe(report(t))
    return confirmed


def test_a_rank_fed_by_its_data_loader_works_though_its_stack_sits_still(
        tmp_path: Path) -> None:
    w, said, moved = watch(tmp_path, [LOADER] * 6, rose=(0.2, 0.7))
    assert observe(w, [0, 1]) is None  # suspected, then about to confirm: fed
    assert moved and moved[0] == {0: "loads"}
    working = [s for s in said if s.startswith("HangSuspected: not confirmed")]
    assert len(working) == 1 and "rank(s) 0 wait in the data loader and get batches" in \
        working[0] and 'trainguard.phase("eval")' in working[0]


def test_reads_of_the_loaders_start_are_not_batches(tmp_path: Path) -> None:
    """The loader's start (forking its workers) reads; a loader stuck from its first batch
    read last then, before the first look found it waiting."""
    w, said, moved = watch(tmp_path, [LOADER] * 6, rose=(-3, -2))
    assert observe(w, [0, 1, 2, 3, 4, 5]) is not None and moved == []
    assert said[-1].startswith("HangConfirmed: hang confirmed") and "data loader" in said[-1]


def test_a_loader_that_stops_handing_over_is_confirmed_hung(tmp_path: Path) -> None:
    """Its workers stuck or dead after some batches: nothing read for LOADER_FED_S."""
    w, said, moved = watch(tmp_path, [LOADER] * 7, rose=(0.2, 0.7))
    assert observe(w, [0, 10, 11, 12, 13, 14, 15]) is not None
    assert moved == [{0: "loads"}]  # at the first look only
    assert said[-1].startswith("HangConfirmed: hang confirmed")


def test_reads_of_a_rank_that_is_not_in_its_loader_are_not_work(tmp_path: Path) -> None:
    """A rank in a collective that reads (a store's heartbeat, a logger): not fed."""
    w, _, moved = watch(tmp_path, [WAIT] * 6, rose=(0.2, 0.7))
    assert observe(w, [0, 1, 2, 3, 4, 5]) is not None and moved == []


def test_the_sample_counts_the_read_calls_of_the_rank_process_itself() -> None:
    r, wfd = os.pipe()
    try:
        before = _tree_usage(os.getpid())[2]
        os.write(wfd, b"x" * 10)
        t = threading.Thread(target=lambda: [os.read(r, 1) for _ in range(10)])
        t.start()  # another thread's reads count: a loader's pin-memory thread reads so
        t.join()
        after = _tree_usage(os.getpid())[2]
        assert before is not None and after is not None and after - before >= 10
    finally:
        os.close(r)
        os.close(wfd)
    assert _tree_usage(2 ** 22 + 12345) == (None, None, None)  # no such process
