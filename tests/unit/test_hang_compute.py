"""A silent evaluation whose time goes to its kernels is not a hang (walk-through 33 #2): a
GEMM-bound forward sits in `torch/nn/modules/linear.py` at every look, one place each time,
and was confirmed hung at 8 s and restarted (llm preset). Found in a numeric library's
compute at every look with its CPU busy, it works; a user's busy loop, a rank waiting in a
collective, an idle one, or one on a node with an accelerator (its load says) do not."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tests.unit.helpers import NO_STEPS, fake_hang_watch
from trainguard.controller.hang_evidence import rank_stack
from trainguard.hang.detector import HangPolicy, HangState
from trainguard.hang.stacks import in_library_compute
from trainguard.protocol import FrameMsg, RankLiveness, StackDump, ThreadMsg

T0 = datetime(2026, 12, 6, tzinfo=timezone.utc)
TORCH = "/venv/lib/python3.11/site-packages/torch/"
GEMM = [("forward", f"{TORCH}nn/modules/linear.py", 134),
        ("_call_impl", f"{TORCH}nn/modules/module.py", 1762),
        ("forward", f"{TORCH}nn/modules/container.py", 240),
        ("evaluate", "/job/train.py", 76), ("<module>", "/job/train.py", 90)]
SPIN = [("busy", "/job/train.py", 12), ("<module>", "/job/train.py", 30)]
WAIT = [("barrier", f"{TORCH}distributed/distributed_c10d.py", 4600),
        ("<module>", "/job/train.py", 88)]


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def dump(frames: list[tuple[str, str, int]], idle: bool | None = False) -> StackDump:
    return StackDump(rank=0, pid=100, threads=[ThreadMsg(
        thread_id=100, name="MainThread", idle=idle,
        frames=[FrameMsg(name=n, filename=f, line=line) for n, f, line in frames])])


def test_a_forward_in_torch_is_library_compute_and_a_users_loop_is_not() -> None:
    assert in_library_compute(rank_stack(dump(GEMM)))
    assert not in_library_compute(rank_stack(dump(GEMM, idle=True)))  # waiting, not running
    assert not in_library_compute(rank_stack(dump(GEMM, idle=None)))  # not known
    assert not in_library_compute(rank_stack(dump(SPIN)))
    assert not in_library_compute(rank_stack(dump(WAIT)))


def watch(tmp_path: Path, frames: list[tuple[str, str, int]]) -> tuple[Any, list[str], list[Any]]:
    said: list[str] = []
    moved: list[Any] = []
    w = fake_hang_watch(
        [HangState.SUSPECTED, *[HangState.CONFIRMED] * 8], said,
        SimpleNamespace(dump_stacks=lambda cmd: [dump(frames)]), str(tmp_path),
        policy=HangPolicy(), seen_working=lambda ranks, now: moved.append(dict(ranks)) or True)
    return w, said, moved


def observe(w: Any, cpu_per_s: float, accel: int | None = None) -> Any:
    """Polls a second apart; rank 0's process tree uses `cpu_per_s` of a CPU."""
    confirmed = None
    for t in range(6):
        live = [RankLiveness(rank=0, last_step=20, last_progress_at=at(-9), cpu_s=cpu_per_s * t,
                             accel_util=accel, sampled_at=at(t))]
        confirmed = confirmed or w.observe(SimpleNamespace(
            at=at(t), liveness=live, progress=NO_STEPS, workers=[]))
    return confirmed


def test_a_rank_computing_in_torch_with_its_cpu_busy_works(tmp_path: Path) -> None:
    w, said, moved = watch(tmp_path, GEMM)
    assert observe(w, cpu_per_s=0.95) is None
    assert moved and moved[0] == {0: "computes"}
    working = [s for s in said if s.startswith("HangSuspected: not confirmed")]
    assert len(working) == 1 and "rank(s) 0 compute in a numeric library (torch) with their " \
        "CPU busy" in working[0]


def test_a_rank_in_torch_that_uses_no_cpu_is_confirmed(tmp_path: Path) -> None:
    w, said, moved = watch(tmp_path, GEMM)
    assert observe(w, cpu_per_s=0.05) is not None and moved == []
    assert said[-1].startswith("HangConfirmed: hang confirmed")


def test_a_users_busy_loop_is_confirmed_however_busy(tmp_path: Path) -> None:
    w, _, moved = watch(tmp_path, SPIN)
    assert observe(w, cpu_per_s=1.0) is not None and moved == []


def test_on_a_node_with_an_accelerator_its_load_decides_not_the_cpu(tmp_path: Path) -> None:
    """A GPU rank whose kernel queue is full spins in the launch, in torch's forward, with
    its CPU busy, even when the GPU hangs: there the accelerator's varying load is the sign."""
    w, _, moved = watch(tmp_path, GEMM)
    assert observe(w, cpu_per_s=1.0, accel=100) is not None and moved == []


def test_the_cpu_samples_kept_are_the_looks_window_s(tmp_path: Path) -> None:
    """Review of walk-through 33 #7: the samples grew for as long as a suspicion lasted."""
    from trainguard.controller.hang_watch import MOTION_WINDOW_S

    w, _, _ = watch(tmp_path, WAIT)
    w._note_cpu(SimpleNamespace(liveness=[]))
    for t in range(600):
        w._note_cpu(SimpleNamespace(liveness=[RankLiveness(rank=0, cpu_s=float(t),
                                                           sampled_at=at(t))]))
    assert len(w._cpu[0]) == MOTION_WINDOW_S + 1
