"""Time the training loop is blocked per checkpoint save, for ~1 GiB of model + AdamW state.

One process, side by side, interleaved (the savers in a new random order every round), and
--repeats times with fresh savers and fresh buffers, --saves saves each:

* (a) trainguard: `Checkpointer(DIR, async_save=True, keep=2).save(step, state)`, the time
  until it returns (save 1 allocates the staging buffers, so it is reported apart);
* (b) synchronous `torch.save({"model": m.state_dict(), "optimizer": opt.state_dict()}, f)`
  plus flush and fsync;
* (c) `torch.distributed.checkpoint.async_save` of the same dict (gloo group, world size 1,
  `FileSystemWriter`), the time until it returns;
* (d) the floor: `buf.copy_(t)` for every tensor into buffers allocated and touched
  beforehand (`torch.empty_like(t).zero_()`); and `t.clone()` of every tensor, for
  comparison (a fresh allocation every save);
* (e) trainguard's memory snapshot: `Checkpointer(memory_every=1).maybe_save(step, state)`
  into a region in /dev/shm, the time until it returns (its CRC-32, computed after, is
  waited for outside the timed region).

Before every timed save the parameters change (an AdamW step on fixed fake gradients), and
after it the saver's background write is waited for, both outside the timed region, so no
timed save waits on an earlier one. The pieces of (a) are timed in place, from outside
(`Probe`: the module functions save() calls and its pool's copy, wrapped), which gives the
breakdown of its blocked time. Write throughput: trainguard's background write
(`write_s` of the save) against `dd ... conv=fsync` of the same size on the same disk, with
in-memory references (sha256 of the bytes, torch.save into a discarding writer).

    .venv/bin/python benchmarks/checkpoint_blocking.py [--size-gib 1.0] [--saves 4]
        [--repeats 4] [--width 4096] [--dir DIR]
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from _common import REPO, BenchError, Spread, load_note, machine_line, markdown_table
from torch import nn
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.state_dict_saver import async_save

import trainguard.checkpoint.checkpointer as checkpointer_module
from trainguard.checkpoint import Checkpointer
from trainguard.worker.contract import ENV_MEMORY_DIR

SHM = "/dev/shm"  # the memory snapshots' tmpfs, as on a node

GIB = 1 << 30
# Linear(width, width) layers. At 4096 every weight is 64 MiB, above glibc's largest mmap
# threshold (32 MiB), so a fresh allocation of it is always a new mmap that page-faults on
# first touch, as with the large matrices of real models; at 2048 (16 MiB) freed memory is
# recycled from the heap, and fresh allocations (clone, DCP's staging) get cheap after the
# first few.
WIDTH = 4096


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} {load_note()}] {msg}", file=sys.stderr, flush=True)


# -- the state ------------------------------------------------------------------------------


class TrainState:
    """A stack of Linear layers and AdamW after one real step (exp_avg, exp_avg_sq exist)."""

    def __init__(self, size_gib: float, width: int = WIDTH) -> None:
        per_layer = width * width + width
        target_params = size_gib * GIB / 4 / 3  # fp32 parameters + two Adam moments
        layers = max(1, round(target_params / per_layer))
        torch.manual_seed(0)
        self.model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        loss = self.model(torch.randn(8, width)).square().mean()
        loss.backward()
        self.opt.step()
        for p in self.model.parameters():  # fixed fake gradients for the mutating steps
            assert p.grad is not None
            p.grad.normal_(0.0, 1e-3)
        self.layers, self.width = layers, width
        self.state: dict[str, Any] = {"model": self.model, "optimizer": self.opt}
        self.tensors: list[torch.Tensor] = list(self.model.state_dict().values())
        for per_param in self.opt.state.values():
            self.tensors.extend(v for v in per_param.values() if isinstance(v, torch.Tensor))
        self.nbytes = sum(t.numel() * t.element_size() for t in self.tensors)
        self.params = sum(p.numel() for p in self.model.parameters())

    def mutate(self) -> None:
        """A training step's worth of change: every parameter and Adam moment is rewritten."""
        self.opt.step()

    def state_dicts(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.opt.state_dict()}


# -- the savers -----------------------------------------------------------------------------


class Saver:
    """One way to save. `save` is the timed part; `finish` runs after it, untimed."""

    key = ""
    label = ""

    def save(self, step: int) -> None:
        raise NotImplementedError

    def finish(self, step: int) -> dict[str, float]:
        return {}

    def close(self) -> None:
        pass


class TrainguardSaver(Saver):
    """trainguard's own save(), with its pieces timed from outside (see Probe)."""

    key, label = "a", "(a) trainguard `save()`, async"

    def __init__(self, ts: TrainState, root: Path) -> None:
        self.ts = ts
        self.ckpt = Checkpointer(root / "trainguard", async_save=True, keep=2)
        self.probe = Probe(self.ckpt)

    def save(self, step: int) -> None:
        self.probe.reset()
        if not self.ckpt.save(step, self.ts.state):
            raise BenchError("trainguard skipped a save")

    def finish(self, step: int) -> dict[str, float]:
        out = {f"{k}_s": v for k, v in self.probe.times.items()}
        out["inner_blocked_s"] = self.ckpt.last_blocked_s or 0.0
        t0 = time.perf_counter()
        self.ckpt.wait()
        out["wait_s"] = time.perf_counter() - t0
        pending = self.ckpt._pending  # the save's own result: write_s, bytes (or its error)
        if pending is None:
            raise BenchError("trainguard started no save")
        res = pending.result()
        out["write_s"], out["bytes"] = res.write_s, float(res.bytes_written)
        return out

    def close(self) -> None:
        try:
            self.ckpt.close()
        finally:
            self.probe.close()


class Probe:
    """Times the pieces of Checkpointer.save() without changing it: wraps the functions
    checkpointer.py calls (split, capture_rng, stage) in its module, and the copy method of
    this Checkpointer's BufferPool. A few microseconds per call, against tens of ms."""

    NAMES = ("split", "capture_rng", "stage")

    def __init__(self, ckpt: Checkpointer) -> None:
        self.times: dict[str, float] = {}
        self.originals: dict[str, Callable[..., Any]] = {}
        for name in self.NAMES:
            fn = getattr(checkpointer_module, name, None)
            if callable(fn):
                self.originals[name] = fn
                setattr(checkpointer_module, name, self._timed(name, fn))
        pool = ckpt._pool
        pool.copy = self._timed("copy", pool.copy)  # type: ignore[method-assign]

    def _timed(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed_call(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.times[name] = self.times.get(name, 0.0) + time.perf_counter() - t0
        return timed_call

    def reset(self) -> None:
        self.times = {name: 0.0 for name in (*self.originals, "copy")}

    def close(self) -> None:
        for name, fn in self.originals.items():
            setattr(checkpointer_module, name, fn)
        self.originals.clear()


class TorchSaveSaver(Saver):
    key, label = "b", "(b) `torch.save` + fsync, sync"

    def __init__(self, ts: TrainState, root: Path) -> None:
        self.ts, self.dir = ts, root / "torch_save"
        self.dir.mkdir()

    def save(self, step: int) -> None:
        with open(self.dir / f"step-{step}.pt", "wb") as f:
            torch.save(self.ts.state_dicts(), f)
            f.flush()
            os.fsync(f.fileno())

    def finish(self, step: int) -> dict[str, float]:
        size = (self.dir / f"step-{step}.pt").stat().st_size
        for p in self.dir.iterdir():
            if p.name != f"step-{step}.pt":
                p.unlink()
        return {"bytes": float(size)}


class DcpSaver(Saver):
    key, label = "c", "(c) DCP `async_save`"

    def __init__(self, ts: TrainState, root: Path) -> None:
        self.ts, self.dir = ts, root / "dcp"
        self.dir.mkdir()
        self.pending: Any = None

    def save(self, step: int) -> None:
        writer = FileSystemWriter(str(self.dir / f"step-{step}"))
        self.pending = async_save(self.ts.state_dicts(), storage_writer=writer)

    def finish(self, step: int) -> dict[str, float]:
        t0 = time.perf_counter()
        fut = self.pending
        upload: Future[Any] = getattr(fut, "upload_completion", fut)
        upload.result()
        wait_s = time.perf_counter() - t0
        del fut, upload
        self.pending = None  # free the staged copy
        size = sum(p.stat().st_size for p in (self.dir / f"step-{step}").rglob("*")
                   if p.is_file())
        for p in self.dir.iterdir():
            if p.name != f"step-{step}":
                shutil.rmtree(p)
        return {"wait_s": wait_s, "bytes": float(size)}


class MemorySaver(Saver):
    """trainguard's memory snapshot into a /dev/shm region, as the node agent makes it."""

    key, label = "e", "(e) trainguard memory snapshot (`memory_every=1`)"

    def __init__(self, ts: TrainState, root: Path) -> None:
        self.ts = ts
        self.region = Path(tempfile.mkdtemp(prefix="trainguard-bench-", dir=SHM))
        os.environ[ENV_MEMORY_DIR] = str(self.region)
        self.ckpt = Checkpointer(root / "memory", memory_every=1, save_on_exit=False)

    def save(self, step: int) -> None:
        self.ckpt.maybe_save(step, self.ts.state)

    def finish(self, step: int) -> dict[str, float]:
        memory = self.ckpt._memory
        assert memory is not None and memory.slots.last_step == step, "no snapshot was made"
        t0 = time.perf_counter()
        memory.slots.wait()
        return {"checksum_s": time.perf_counter() - t0}

    def close(self) -> None:
        try:
            self.ckpt.close()
        finally:
            os.environ.pop(ENV_MEMORY_DIR, None)
            shutil.rmtree(self.region, ignore_errors=True)


class FloorSaver(Saver):
    key, label = "d", "(d) floor: `buf.copy_(t)` into touched buffers"

    def __init__(self, ts: TrainState) -> None:
        self.pairs = [(torch.empty_like(t).zero_(), t) for t in ts.tensors]

    def save(self, step: int) -> None:
        for buf, t in self.pairs:
            buf.copy_(t)


class CloneSaver(Saver):
    key, label = "clone", "fresh `t.clone()` of every tensor"

    def __init__(self, ts: TrainState) -> None:
        self.ts = ts
        self.clones: list[torch.Tensor] = []

    def save(self, step: int) -> None:
        self.clones = [t.clone() for t in self.ts.tensors]

    def finish(self, step: int) -> dict[str, float]:
        self.clones = []
        return {}


# -- references for the write throughput ----------------------------------------------------


def run_dd(path: Path, mib: int, direct: bool) -> float | None:
    """dd of `mib` MiB with fsync; its own elapsed seconds, None when unsupported."""
    cmd = ["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={mib}", "conv=fsync"]
    if direct:
        cmd.append("oflag=direct")
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    path.unlink(missing_ok=True)
    if proc.returncode != 0:
        if direct:
            return None
        raise BenchError(f"dd failed: {proc.stderr.strip()}")
    m = re.search(r"copied, ([0-9.]+) s", proc.stderr)
    if m is None:
        raise BenchError(f"cannot read dd's output: {proc.stderr.strip()}")
    return float(m.group(1))


class Discard:
    def write(self, data: bytes | bytearray | memoryview) -> int:
        return len(data)

    def flush(self) -> None:
        pass


def sha256_s(tensors: Sequence[torch.Tensor]) -> float:
    h = hashlib.sha256()
    t0 = time.perf_counter()
    for t in tensors:
        h.update(t.detach().reshape(-1).numpy().data.cast("B"))
    return time.perf_counter() - t0


def serialize_s(ts: TrainState) -> float:
    t0 = time.perf_counter()
    torch.save(ts.state_dicts(), Discard())  # type: ignore[arg-type]
    return time.perf_counter() - t0


# -- the run --------------------------------------------------------------------------------


@dataclass
class Sample:
    repeat: int
    save: int  # 1-based
    blocked_s: float
    extra: dict[str, float] = field(default_factory=dict)


@dataclass
class Results:
    samples: dict[str, list[Sample]] = field(default_factory=dict)
    refs: dict[str, list[float]] = field(default_factory=dict)

    def add(self, key: str, s: Sample) -> None:
        self.samples.setdefault(key, []).append(s)

    def ref(self, key: str, v: float | None) -> None:
        if v is not None:
            self.refs.setdefault(key, []).append(v)


def timed(fn: Callable[[], None]) -> float:
    gc.collect()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def one_repeat(rep: int, ts: TrainState, root: Path, saves: int, res: Results) -> None:
    work = root / f"repeat-{rep}"
    work.mkdir()
    savers: list[Saver] = [
        TrainguardSaver(ts, work), TorchSaveSaver(ts, work),
        DcpSaver(ts, work), FloorSaver(ts), CloneSaver(ts), MemorySaver(ts, work),
    ]
    try:
        mib = max(1, round(ts.nbytes / (1 << 20)))
        for direct in ((True, False) if rep % 2 == 0 else (False, True)):
            res.ref("dd_direct" if direct else "dd_buffered", run_dd(work / "dd", mib, direct))
        for i in range(saves):
            order = list(savers)
            random.Random(1000 * rep + i).shuffle(order)  # no saver always follows another
            for s in order:
                ts.mutate()
                step = rep * 1000 + i + 1
                blocked = timed(lambda s=s, step=step: s.save(step))  # type: ignore[misc]
                res.add(s.key, Sample(rep, i + 1, blocked, s.finish(step)))
            log(f"repeat {rep + 1} save {i + 1}/{saves}: " + ", ".join(
                f"{s.key} {res.samples[s.key][-1].blocked_s:.3f}s" for s in order))
        floor = next(s for s in savers if isinstance(s, FloorSaver))
        res.ref("sha256", sha256_s([b for b, _ in floor.pairs]))
        res.ref("serialize", serialize_s(ts))
    finally:
        for s in savers:
            s.close()
        savers.clear()
        gc.collect()
        shutil.rmtree(work, ignore_errors=True)


# -- the report -----------------------------------------------------------------------------


def fmt(v: float) -> str:
    return f"{v:.3f}"


def spread_cell(values: Sequence[float]) -> str:
    sp = Spread.of(values)
    return f"{fmt(sp.median)} ({fmt(sp.lo)}-{fmt(sp.hi)})"


def blocked_table(res: Results, gib: float, labels: dict[str, str]
                  ) -> tuple[str, dict[str, tuple[float, float]]]:
    floor_later = [s.blocked_s for s in res.samples["d"] if s.save > 1]
    floor_med = statistics.median(floor_later)
    rows = []
    for key in ("a", "e", "b", "c", "d", "clone"):
        ss = res.samples[key]
        first = [s.blocked_s for s in ss if s.save == 1]
        later = [s.blocked_s for s in ss if s.save > 1]
        med = statistics.median(later)
        rows.append([labels[key], spread_cell(first), spread_cell(later),
                     fmt(med / gib), f"{med / floor_med:.2f}x"])
    table = markdown_table(
        ["saver", "save 1: s (min-max)", "saves 2..N: s, median (min-max)", "s/GiB",
         "vs floor"], rows)
    # paired: trainguard's and the floor's in the same round
    floor_by = {(s.repeat, s.save): s.blocked_s for s in res.samples["d"]}
    ratios = {}
    for key in ("a", "e"):
        later = [s for s in res.samples[key] if s.save > 1]
        paired = [s.blocked_s / floor_by[(s.repeat, s.save)] for s in later]
        ratios[key] = (statistics.median(s.blocked_s for s in later) / floor_med,
                       statistics.median(paired))
    return table, ratios


def breakdown_table(res: Results) -> str:
    ss = res.samples["a"]

    def med(first: bool, fn: Callable[[Sample], float | None]) -> str:
        vals = [v for s in ss if (s.save == 1) == first and (v := fn(s)) is not None]
        return fmt(statistics.median(vals)) if vals else "n/a"

    def part(s: Sample, k: str) -> float | None:
        return s.extra.get(f"{k}_s")

    def traversal(s: Sample) -> float | None:
        st, cp = part(s, "stage"), part(s, "copy")
        return None if st is None or cp is None else st - cp

    def rest(s: Sample) -> float | None:
        known = [part(s, k) for k in ("split", "capture_rng", "stage")]
        return s.blocked_s - sum(v for v in known if v is not None)

    total = statistics.median(s.blocked_s for s in ss if s.save > 1)
    rows_spec: list[tuple[str, Callable[[Sample], float | None]]] = [
        ("split(): model.state_dict(), optimizer.state_dict()", lambda s: part(s, "split")),
        ("capture_rng()", lambda s: part(s, "capture_rng")),
        ("stage(): traversal of the tree, settle (all but the copies)", traversal),
        ("stage(): BufferPool.copy (save 1: + allocate and zero_ the buffers)",
         lambda s: part(s, "copy")),
        ("the rest: in-flight check, SaveJob, hand-off to the writer thread", rest),
        ("total: save() until it returns (the blocked time above)", lambda s: s.blocked_s),
        ("save()'s own `last_blocked_s`", lambda s: s.extra["inner_blocked_s"]),
    ]
    rows = []
    for label, fn in rows_spec:
        later = [v for s in ss if s.save > 1 and (v := fn(s)) is not None]
        share = f"{100 * statistics.median(later) / total:.0f}%" if later else ""
        rows.append([label, med(True, fn), med(False, fn), share])
    return markdown_table(["part of save()", "save 1: s, median", "saves 2..N: s, median",
                           "share"], rows)


def throughput_table(res: Results) -> str:
    tg = res.samples["a"]
    gib = statistics.median(s.extra["bytes"] for s in tg) / GIB
    rows: list[list[str]] = []
    dd_direct = statistics.median(res.refs["dd_direct"]) if "dd_direct" in res.refs else None

    def row(label: str, size_gib: float, secs: Sequence[float]) -> None:
        med = statistics.median(secs)
        rate = size_gib / med
        vs = f"{rate / (gib / dd_direct):.2f}" if dd_direct else "-"
        rows.append([label, f"{size_gib:.3f}", spread_cell(secs), f"{rate:.2f}", vs])

    row("(a) trainguard background write (`write_s`: serialise, sha256, write, fsync, commit)",
        gib, [s.extra["write_s"] for s in tg])
    row("(a) trainguard `wait()` right after `save()` returned", gib,
        [s.extra["wait_s"] for s in tg])
    tsv = res.samples["b"]
    row("(b) `torch.save` + fsync (blocking)",
        statistics.median(s.extra["bytes"] for s in tsv) / GIB, [s.blocked_s for s in tsv])
    dc = res.samples["c"]
    row("(c) DCP: wait on its future after `async_save` returned",
        statistics.median(s.extra["bytes"] for s in dc) / GIB, [s.extra["wait_s"] for s in dc])
    if dd_direct:
        row("`dd bs=1M oflag=direct conv=fsync`", gib, res.refs["dd_direct"])
    else:
        rows.append(["`dd oflag=direct`: not supported here", "-", "-", "-", "-"])
    row("`dd bs=1M conv=fsync` (through the page cache)", gib, res.refs["dd_buffered"])
    row("in memory: sha256 of the state's bytes (one thread)", gib, res.refs["sha256"])
    row("in memory: `torch.save` into a discarding writer", gib, res.refs["serialize"])
    table = markdown_table(["write", "GiB", "s, median (min-max)", "GiB/s", "vs dd direct"],
                           rows)
    parts = [statistics.median(res.refs[k]) for k in ("serialize", "sha256", "dd_buffered")]
    return (f"{table}\n\ntrainguard's writer does these one after the other on one thread: "
            f"serialise {fmt(parts[0])} s + sha256 {fmt(parts[1])} s + buffered write and "
            f"fsync (dd) {fmt(parts[2])} s = {fmt(sum(parts))} s, against its `write_s` "
            f"{fmt(statistics.median(s.extra['write_s'] for s in tg))} s")


def default_dir() -> Path:
    """A fresh directory next to the repository when that is the same disk, else in /tmp."""
    parent = REPO.parent
    if not (os.access(parent, os.W_OK) and os.stat(parent).st_dev == os.stat(REPO).st_dev):
        parent = Path(tempfile.gettempdir())
    return Path(tempfile.mkdtemp(prefix="trainguard-bench-ckpt-", dir=parent))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-gib", type=float, default=1.0, help="state size (default 1.0)")
    ap.add_argument("--saves", type=int, default=4, help="saves per saver per repeat")
    ap.add_argument("--repeats", type=int, default=4, help="fresh savers, this many times")
    ap.add_argument("--width", type=int, default=WIDTH,
                    help=f"Linear(width, width) layers (default {WIDTH}: 64 MiB weights)")
    ap.add_argument("--dir", type=Path, default=None,
                    help="where to write (default: a temp dir next to the repo, same disk)")
    args = ap.parse_args(argv)
    if args.saves < 2:
        ap.error("--saves must be at least 2 (save 1 is reported apart)")

    if args.dir is None:
        root = default_dir()
    else:
        args.dir.mkdir(parents=True, exist_ok=True)
        root = Path(tempfile.mkdtemp(prefix="trainguard-bench-ckpt-", dir=args.dir))
    started = time.monotonic()
    try:
        dist.init_process_group("gloo", init_method=f"file://{root}/pg-store", rank=0,
                                world_size=1)
        ts = TrainState(args.size_gib, args.width)
        gib = ts.nbytes / GIB
        log(f"state: {ts.layers} x Linear({ts.width}, {ts.width}) + AdamW, {ts.params / 1e6:.1f} M "
            f"parameters, {len(ts.tensors)} tensors, {gib:.3f} GiB; writing under {root}")
        res = Results()
        for rep in range(args.repeats):
            one_repeat(rep, ts, root, args.saves, res)
        labels = {"a": TrainguardSaver.label, "b": TorchSaveSaver.label, "c": DcpSaver.label,
                  "d": FloorSaver.label, "clone": CloneSaver.label, "e": MemorySaver.label}
        table, ratios = blocked_table(res, gib, labels)
        print(f"\n{machine_line()}; torch threads {torch.get_num_threads()}; {load_note()}")
        print(f"state: {ts.layers} x Linear({ts.width}, {ts.width}) + AdamW after one step: "
              f"{ts.params / 1e6:.1f} M parameters, {len(ts.tensors)} tensors, "
              f"{gib:.3f} GiB; {args.repeats} repeats x {args.saves} saves; written to "
              f"{root.parent}")
        print("\n### Blocked time per save (the training loop waits this long)\n")
        print(table)
        for key, (ratio, paired) in ratios.items():
            verdict = "met" if ratio <= 1.5 else "NOT met"
            print(f"\n({key})/(d) from the second save on: {ratio:.2f}x the floor (ratio of "
                  f"medians), {paired:.2f}x (median of per-round ratios); target <= 1.5x: "
                  f"{verdict}")
        crc = [v for sm in res.samples["e"] if sm.save > 1
               and (v := sm.extra.get("checksum_s")) is not None]
        print(f"\n(e)'s CRC-32 after the copy, off the loop: {fmt(statistics.median(crc))} s "
              "left to wait right after the snapshot returned (median)")
        print("\n### Where trainguard's save() spends its blocked time\n")
        print(breakdown_table(res))
        print("\n### Write throughput\n")
        print(throughput_table(res))
        print(f"\ntotal {time.monotonic() - started:.0f} s")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
