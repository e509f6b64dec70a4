"""Step re-execution in the training script: one training step as a transaction (rung 0).

    guard = StepGuard(model)                 # wraps the model in DDP, as the script did
    for step in range(start, steps + 1):
        x, y = get_batch(step)               # fetched outside: a re-run takes the same batch
        def train_step():
            optimizer.zero_grad(set_to_none=True)
            loss = guard.model(x, y)         # guard.model: the current DDP wrapper
            loss.backward()
            return loss
        loss = guard.run(step, train_step)   # every rank agreed the step is good
        optimizer.step()                     # only then the update

When the launcher runs the job with --operator-reexecution, a step that fails with a
transient collective error (a broken connection, a timeout) on any rank is discarded on every
rank (gradients dropped, the RNG states put back to the step's start), the rank reports it to
its agent and waits for the verdict, which comes out of band (agent -> controller -> every
rank's agent), never through the broken group. On REFORM it destroys the process group, joins
a fresh one at the address the controller handed out, wraps the model in a new DDP and runs
the step again; on GIVE_UP (a budget spent), or when no verdict comes in time, it raises the
step's error, and the process restart (the next rung) takes over. Without the launcher, or
with re-execution off, `run` only calls the step. docs/operator-reexecution.md has the rules.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _set_pg_timeout

from trainguard.worker import channel, control
from trainguard.worker.contract import (
    ENV_MASTER_ADDR,
    ENV_MASTER_PORT,
    ENV_STEP_RETRY,
    ENV_STEP_RETRY_TIMEOUT,
    ControlKind,
    MessageKind,
)
from trainguard.worker.progress import phase
from trainguard.worker.transient import is_transient

T = TypeVar("T")

class StepGuard:
    """Runs training steps as transactions; see the module docstring."""

    def __init__(self, module: torch.nn.Module, **ddp_kwargs: Any) -> None:
        self.module = module
        self._ddp_kwargs = ddp_kwargs
        self.distributed = dist.is_available() and dist.is_initialized() \
            and dist.get_world_size() > 1
        # the group's generation: 0, or the one an in-process restart joined
        self.generation = control.pg_generation()
        self.reexecuted = 0  # steps re-executed in this process
        self.enabled = self.distributed and os.environ.get(ENV_STEP_RETRY) == "1"
        self._timeout_s = control.env_float(ENV_STEP_RETRY_TIMEOUT, 60.0)
        # listening before DDP is built (a collective): a fast peer may fail its first step
        self._inbox = control.inbox() if self.enabled else None
        self.enabled = self._inbox is not None
        self.model: torch.nn.Module = self._wrap()
        self._group_timeout = _group_timeout() if self.enabled else None
        # the vote's tensor lives where the backend reduces (a re-formed group keeps it)
        self._vote_device = "cuda" if self.enabled and dist.get_backend() == "nccl" else "cpu"

    def _wrap(self) -> torch.nn.Module:
        if not self.distributed:
            return self.module
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(self.module, **self._ddp_kwargs)

    def run(self, step: int, fn: Callable[[], T]) -> T:
        """Run `fn` (forward and backward of `step`) until every rank agrees it succeeded."""
        if not self.enabled:
            return fn()
        rng = _rng_state()
        failed_at: float | None = None
        while True:
            try:
                out = fn()
                self._agree()
            except Exception as e:
                if not is_transient(e):
                    raise
                failed_at = failed_at or time.monotonic()
                self._discard(rng)
                self._recover(step, e)
                continue
            if failed_at is not None:
                self.reexecuted += 1
                channel.send(MessageKind.STEP_REEXECUTED, step=step, generation=self.generation,
                             retry_s=round(time.monotonic() - failed_at, 6))
                _say(f"step {step} re-executed on process group generation {self.generation} "
                     f"({time.monotonic() - failed_at:.3f}s after it failed)")
            return out

    def close(self) -> None:
        """Drop the DDP wrapper. Call it before `destroy_process_group`: the wrapper's reducer
        holds the group, and a group whose last reference goes with the reducer is destroyed
        while this thread holds the GIL, which gloo's worker thread may be waiting for
        (a deadlock in ~ProcessGroupGloo). `destroy_process_group` releases the GIL."""
        self.model = self.module

    # -- the transaction ---------------------------------------------------------------------

    def _agree(self) -> None:
        """Every rank finished the step: one small all-reduce before any optimizer update (a
        rank whose step failed never gets here, so its peers fail here too)."""
        dist.all_reduce(torch.ones(1, device=self._vote_device))

    def _discard(self, rng: dict[str, Any]) -> None:
        self.module.zero_grad(set_to_none=True)
        _set_rng_state(rng)

    def _recover(self, step: int, error: BaseException) -> None:
        """Report the failed step; re-form the group on REFORM, raise `error` otherwise."""
        text, first = control.error_text(error)
        _say(f"step {step} failed on process group generation {self.generation} ({first}); "
             "waiting for the launcher's verdict")
        # a verdict may be here already (a peer reported first): _await_verdict keeps it
        report = {"step": step, "generation": self.generation, "error": text}
        with phase("step_reexecution", timeout_s=2 * self._timeout_s + 10):  # not a hang
            verdict = self._await_verdict(step, report)
            if verdict is not None and verdict["kind"] == ControlKind.REFORM:
                # a REFORM is a proposal: the launcher confirms it (REFORM_GO) once every
                # running rank got it, or takes it back (GIVE_UP), so no rank waits in a
                # rendezvous that a peer who missed the REFORM never joins
                verdict = self._confirmation(verdict)
            if verdict is not None and verdict["kind"] == ControlKind.RESTART:
                raise control.RestartRequested(verdict)  # run_resilient re-enters
            if verdict is not None and verdict["kind"] == ControlKind.REFORM_GO:
                self._reform(verdict)
                return
        if verdict is None and control.STOPPING.is_set():
            _say(f"the launcher is stopping this rank: step {step} is not re-executed")
        elif verdict is None:
            _say(f"no verdict within {self._timeout_s:g}s: giving step {step} up")
        else:
            _say(f"step {step} is not re-executed: {verdict['reason']}")
        raise error

    def _confirmation(self, reform: dict[str, Any]) -> dict[str, Any] | None:
        """The launcher's word on `reform`: REFORM_GO (with the REFORM's address), a GIVE_UP of
        the step, an in-process restart's RESTART, or None after --step-retry-timeout."""
        assert self._inbox is not None
        step, generation = reform.get("step"), reform["generation"]

        def accept(v: dict[str, Any]) -> bool:
            if control.newer_restart(v, self.generation):
                return True
            return v.get("step") == step and (
                v["kind"] == ControlKind.GIVE_UP
                or (v["kind"] == ControlKind.REFORM_GO and v["generation"] == generation))

        got = self._inbox.wait(accept, self._timeout_s)
        return {**reform, "kind": ControlKind.REFORM_GO} \
            if got is not None and got["kind"] == ControlKind.REFORM_GO else got

    def _reform(self, v: dict[str, Any]) -> None:
        t0 = time.monotonic()
        # the launcher's stop during the rendezvous (a peer that never comes) must end this
        # rank at once: a Python SIGTERM handler (the on-exit save's) cannot run while the
        # rendezvous waits in C++, so SIGTERM keeps its default action until it is over
        with _default_sigterm():
            self._rendezvous(v)
        _say(f"process group re-formed (generation {self.generation}, {v['master_addr']}:"
             f"{v['master_port']}) in {time.monotonic() - t0:.3f}s")

    def _rendezvous(self, v: dict[str, Any]) -> None:
        backend = dist.get_backend()
        rank, world = dist.get_rank(), dist.get_world_size()
        with contextlib.suppress(Exception):  # the old group is broken: tear down what is left
            dist.destroy_process_group()
        addr, port = str(v["master_addr"]), int(v["master_port"])
        os.environ[ENV_MASTER_ADDR], os.environ[ENV_MASTER_PORT] = addr, str(port)
        # the rendezvous waits --step-retry-timeout; the group then keeps the script's timeout
        dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=rank,
                                world_size=world, timeout=timedelta(seconds=self._timeout_s))
        if self._group_timeout is not None:
            with contextlib.suppress(Exception):
                _set_pg_timeout(self._group_timeout)
        self.generation = int(v["generation"])
        self.model = self._wrap()

    def _await_verdict(self, step: int, report: dict[str, Any]) -> dict[str, Any] | None:
        """The verdict on `step` (or an in-process restart's); the report goes again every
        second until one comes (a datagram is dropped when the agent's queue is full)."""
        assert self._inbox is not None

        def accept(v: dict[str, Any]) -> bool:
            if control.newer_restart(v, self.generation):
                return True
            return v.get("step") == step and (v["kind"] == ControlKind.GIVE_UP
                                              or (v["kind"] == ControlKind.REFORM
                                                  and v["generation"] > self.generation))

        return self._inbox.wait(accept, self._timeout_s,
                                lambda: channel.send(MessageKind.STEP_FAILED, **report))


@contextlib.contextmanager
def _default_sigterm() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def _group_timeout() -> timedelta | None:
    """The default group's collective timeout as the script set it (gloo keeps it in its
    options); None when it cannot be read."""
    try:
        world = dist.group.WORLD
        if world is None:
            return None
        value = world._get_backend(torch.device("cpu")).options._timeout
        return value if isinstance(value, timedelta) else None
    except Exception:
        return None


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    np = sys.modules.get("numpy")
    if np is not None:
        state["numpy"] = np.random.get_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        sys.modules["numpy"].random.set_state(state["numpy"])


def _say(line: str) -> None:
    control.say("step", line)
