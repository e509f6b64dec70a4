"""A writer killed with SIGKILL at any moment never costs the last valid checkpoint.

Writers are forked from this process (torch is imported once) and killed by the parent.
Every value saved is a function of the step (conftest.step_state), so after each kill the
loaded checkpoint is checked bit for bit against the step `load_latest` reports.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import os
import random
import select
import signal
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import numpy as np  # noqa: F401  (imported so its RNG is saved and checked too)
import pytest
import torch

from tests.checkpoint.conftest import (
    Where,
    assert_state_is_step,
    fresh_state,
    rngs_are_seeded,
    seed_rngs,
    state_diff,
    step_state,
)
from trainguard.checkpoint import Status
from trainguard.checkpoint.manifest import rank_file, step_dir
from trainguard.checkpoint.storage import Storage

# per backend: 10 in `make test`, 200 in `make torture` (TG_CRASH_KILLS=200)
KILLS = int(os.environ.get("TG_CRASH_KILLS", "10"))
# Each writer is killed uniform(0, window) seconds after it starts saving, the window being
# KILL_WINDOW_SAVES times a save measured here (with its pruning), and at least
# MIN_KILL_WINDOW_S: 0-200 ms on local disk (~8 saves), ~0-500 ms on the S3 server. (Much
# shorter windows on S3 kill most writers inside prune(), which checks every step before it
# deletes any: checkpoints then pile up beyond KEEP and every check gets slower.)
KILL_WINDOW_SAVES = 4
MIN_KILL_WINDOW_S = 0.2
SEED = 20240607
WAIT_EVERY = 3  # the writer waits for its save to be durable every WAIT_EVERY steps
KEEP = 3

pytestmark = [pytest.mark.crash, pytest.mark.usefixtures("no_agent", "keep_rng")]


# -- forked children ----------------------------------------------------------------------

class Child:
    """body(child) run in a forked child that never returns into pytest; lines go both
    ways through pipes (`tell` / `hear` on either side)."""

    def __init__(self, body: Callable[[Child], None]) -> None:
        down_r, self._down = os.pipe()  # parent -> child
        self._up, up_w = os.pipe()  # child -> parent
        self._buf = b""
        self.pid = os.fork()
        if self.pid == 0:
            code = 70
            try:
                os.close(self._down)
                os.close(self._up)
                self._up, self._down = down_r, up_w  # the child reads down, writes up
                gc.freeze()  # pytest's heap: not scanned (and copied) by every collection
                torch.set_num_threads(1)  # the parent's OpenMP pool does not survive a fork
                body(self)
                code = 0
            except BaseException:
                traceback.print_exc()
                sys.stderr.flush()
            finally:
                os._exit(code)
        os.close(down_r)
        os.close(up_w)

    def tell(self, line: str) -> None:
        os.write(self._down, f"{line}\n".encode())

    def hear(self, timeout_s: float = 60.0) -> str:
        """The next line (blocking up to timeout_s)."""
        while b"\n" not in self._buf:
            ready, _, _ = select.select([self._up], [], [], timeout_s)
            if not ready:
                raise AssertionError(f"child {self.pid} said nothing for {timeout_s:g}s")
            data = os.read(self._up, 65536)
            if not data:
                raise AssertionError(f"child {self.pid} exited: see its traceback")
            self._buf += data
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode()

    def kill_and_reap(self) -> tuple[int, list[str]]:
        """SIGKILL, reap: (wait status, every line it wrote and was not heard yet)."""
        os.kill(self.pid, signal.SIGKILL)
        _, status = os.waitpid(self.pid, 0)
        return status, self.close()

    def reap(self) -> int:
        _, status = os.waitpid(self.pid, 0)
        self.close()
        return status

    def close(self) -> list[str]:
        rest = []
        with contextlib.suppress(OSError):
            while data := os.read(self._up, 65536):
                rest.append(data)
        os.close(self._up)
        os.close(self._down)
        return (self._buf + b"".join(rest)).decode().split()


def killed(status: int) -> bool:
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


# -- random kills -------------------------------------------------------------------------

def writer(where: Where, me: Child) -> NoReturn:
    """A resumed run: told the step to resume from, it saves step after step until killed,
    reporting the steps `wait()` made durable."""
    ckpt = where.checkpointer(keep=KEEP, async_save=True, max_consecutive_failures=1)
    ckpt.storage.children()  # connect (S3: ~0.1 s), while the parent checks the last kill
    me.tell("warm")
    start = int(me.hear()) + 1
    for step in itertools.count(start):
        seed_rngs(step)
        ckpt.save(step, step_state(step))
        if step % WAIT_EVERY == 0:
            ckpt.wait()  # raises on the first failed save: no save may fail here
            me.tell(str(ckpt.last_saved_step))
    raise AssertionError("unreachable")


def check_after_kill(where: Where, before: int | None, durable: int | None
                     ) -> tuple[int | None, int]:
    """The newest valid step, checked: exact contents, never older than before; and how
    many checkpoints are listed."""
    ckpt = where.checkpointer()
    state = fresh_state()
    step = ckpt.load_latest(state)
    floor = max(s for s in (before, durable, -1) if s is not None)
    if floor >= 0:
        assert step is not None and step >= floor, (
            f"after the kill the newest valid step is {step}; a step >= {floor} was "
            f"committed before (newest valid before: {before}, reported durable: {durable})")
    if step is not None:
        assert_state_is_step(state, step)
        assert rngs_are_seeded(step), f"the RNG state loaded with step {step} is another step's"
    listing = ckpt.list()
    valid = [c.step for c in listing if c.status == Status.VALID]
    assert all(s <= (step or 0) for s in valid), f"list() shows {listing}, load gave {step}"
    assert step is None or step in valid, f"list() shows {listing}, load gave {step}"
    return step, len(listing)


def kill_window_s(where: Where) -> float:
    """KILL_WINDOW_SAVES times a save that also prunes, measured on this backend (the
    fastest of three: the least noisy estimate)."""
    ckpt = Where(where.backend, f"{where.url}-calibration", where.storage_options
                 ).checkpointer(keep=KEEP, async_save=False)
    times = []
    for step in range(1, KEEP + 4):
        t0 = time.monotonic()
        ckpt.save(step, step_state(step))
        times.append(time.monotonic() - t0)
    return max(MIN_KILL_WINDOW_S, KILL_WINDOW_SAVES * min(times[KEEP:]))


def kill_writers_at_random(where: Where) -> Counter[str]:
    rng = random.Random(SEED)
    newest: int | None = None
    stats: Counter[str] = Counter()
    window = kill_window_s(where)
    stats["kill window ms"] = round(window * 1000)
    child = Child(lambda me: writer(where, me))
    try:
        for _ in range(KILLS):
            assert child.hear() == "warm"
            child.tell(str(newest or 0))  # the kill delay counts from here: saves only
            time.sleep(rng.uniform(0, window))
            status, lines = child.kill_and_reap()
            assert killed(status), f"the writer ended by itself ({status:#x}): see its traceback"
            child = Child(lambda me: writer(where, me))  # connects while we check
            durable = [int(x) for x in lines if x.isdigit()]
            after, listed = check_after_kill(where, newest, max(durable, default=None))
            stats["most listed"] = max(stats["most listed"], listed)
            stats["kills"] += 1
            stats["advanced"] += after != newest
            stats["durable reports"] += len(durable)
            newest = after
    finally:
        with contextlib.suppress(OSError):  # already reaped when its kill failed a check
            child.kill_and_reap()
    stats["newest step"] = newest or 0
    return stats


def assert_leftovers_are_cleaned_by_later_saves(where: Where, newest: int) -> None:
    ckpt = where.checkpointer(keep=KEEP, async_save=False)
    for step in (newest + 1, newest + 2):
        ckpt.save(step, step_state(step))
    ckpt.close()
    listing = ckpt.list()
    assert [(c.step, c.status) for c in listing] == [
        (newest + 2 - i, Status.VALID) for i in range(KEEP)], listing
    names = Storage(where.url, where.storage_options).children()
    assert not [n for n in names if n.startswith(".")], f"leftovers after pruning: {names}"


def test_a_writer_killed_at_random_moments_always_leaves_the_newest_valid_step_exact(
        where: Where) -> None:
    stats = kill_writers_at_random(where)
    print(f"{where.backend}: {dict(stats)}")
    assert stats["kills"] == KILLS
    assert stats["advanced"] >= KILLS // 10, f"too few kills after a commit to mean much: {stats}"
    assert_leftovers_are_cleaned_by_later_saves(where, stats["newest step"])


# -- a kill at every point of one save ----------------------------------------------------

# Storage calls that change what is stored, and the renames inside a local publish.
MUTATIONS = ("write_stream", "write_atomic", "remove", "publish")


def killed_at(point: int) -> None:
    """From now on in this (child) process: SIGKILL just before the point-th mutation."""
    calls = 0

    def counted(fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls == point:
                os.kill(os.getpid(), signal.SIGKILL)
            return fn(*args, **kwargs)
        return call

    for name in MUTATIONS:
        setattr(Storage, name, counted(getattr(Storage, name)))
    os.rename = counted(os.rename)


def save_killed_at(where: Where, point: int, step: int, attempt: int,
                   load_first: bool = False) -> int:
    def body(_me: Child) -> None:
        ckpt = where.checkpointer(keep=2, async_save=False, max_consecutive_failures=1)
        if load_first:  # a resumed run: what loading skips as corrupt is written anew
            ckpt.load_latest(fresh_state())
        killed_at(point)
        ckpt.save(step, step_state(step, attempt))
    return Child(body).reap()


def truncated(data: bytes) -> bytes:
    return data[:100]


def one_byte_flipped(data: bytes) -> bytes:
    return data[:-100] + bytes([data[-100] ^ 1]) + data[-99:]


def committed(where: Where, steps: tuple[int, ...],
              damage: Callable[[bytes], bytes] | None = None) -> None:
    """Steps saved (attempt 0) and committed; `damage` then applied to the last one's rank
    file (under its manifest), as a save cut short or a bad disk would leave it."""
    ckpt = where.checkpointer(keep=2, async_save=False)
    for step in steps:
        ckpt.save(step, step_state(step))
    if damage is not None:
        p = ckpt.storage.path(step_dir(steps[-1]), rank_file(0))
        ckpt.storage.fs.pipe_file(p, damage(ckpt.storage.fs.cat_file(p)))


# (steps committed, damage to the last, the step saved, load first, fewest kill points)
SCENARIOS: dict[str, tuple[tuple[int, ...], Callable[[bytes], bytes] | None, int, bool, int]] = {
    "a-new-step": ((1, 2), None, 3, False, 5),
    "over-a-step-left-broken": ((1, 2, 3), truncated, 3, False, 5),
    "over-a-step-found-corrupt-on-load": ((1, 2, 3), one_byte_flipped, 3, True, 5),
}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_a_kill_at_every_point_of_a_save_keeps_the_previous_checkpoint(
        where: Where, scenario: str) -> None:
    before, damage, step, load_first, fewest = SCENARIOS[scenario]
    for point in itertools.count(1):
        base = Where(where.backend, f"{where.url}/point-{point}", where.storage_options)
        committed(base, before, damage)
        status = save_killed_at(base, point, step, 1, load_first)
        if status == 0:
            break  # the save ran to its end: every point was covered
        assert killed(status), f"the writer failed ({status:#x}): see its traceback"
        state = fresh_state()
        loaded = base.checkpointer().load_latest(state)
        assert loaded in (2, step), f"killed before mutation {point}: loaded step {loaded}"
        attempt = 0 if loaded == 2 else 1  # the previous checkpoint, or all of the new one
        assert not state_diff(state, step_state(loaded, attempt)), (
            f"killed before mutation {point}: step {loaded} is not attempt {attempt}: "
            f"{state_diff(state, step_state(loaded, attempt))}")
    assert point > fewest, f"only {point - 1} kill points: the save did not run as expected"
    state = fresh_state()
    assert base.checkpointer().load_latest(state) == step  # the save that ran to its end
    assert_state_is_step(state, step, attempt=1)


def test_saving_a_step_that_is_already_committed_writes_nothing(where: Where) -> None:
    committed(where, (1, 2))
    assert save_killed_at(where, 1, 2, attempt=1) == 0, "it wrote (or removed) something"
    state = fresh_state()
    assert where.checkpointer().load_latest(state) == 2
    assert_state_is_step(state, 2, attempt=0)


def test_a_kill_while_latest_is_replaced_leaves_nothing_behind_after_the_next_save(
        tmp_path: Path) -> None:
    where = Where("local", str(tmp_path / "ckpt"), None)
    replace = os.replace

    def body(_me: Child) -> None:
        def replace_or_die(src: Any, dst: Any) -> None:
            if os.path.basename(dst) == "latest":
                os.kill(os.getpid(), signal.SIGKILL)
            replace(src, dst)
        os.replace = replace_or_die
        where.checkpointer(async_save=False).save(1, step_state(1))

    assert killed(Child(body).reap())
    ckpt = where.checkpointer(async_save=False)
    for step in (2, 3):
        ckpt.save(step, step_state(step))
    names = Storage(where.url).children()
    assert not [n for n in names if n.startswith(".")], f"leftovers after two saves: {names}"
