"""In-process restart in the training script: re-enter the training function in place.

    def main():
        dist.init_process_group("gloo")        # from MASTER_ADDR / MASTER_PORT, as today
        ...                                   # build, load the newest checkpoint, train
        dist.destroy_process_group()

    if __name__ == "__main__":
        trainguard.run_resilient(main)

Under `trainguard run` (in-process restart is on unless --no-in-process-restart), when a
peer rank dies or hangs, the launcher kills it (a hung gloo peer cannot be aborted, only
killed), starts only that rank again, and tells every surviving rank to restart in place:
`main` raises in the survivor (its collective fails at once when the peer dies; a
StepGuard waiting on a failed step raises RestartRequested), run_resilient reports it,
takes the launcher's verdict (out of band, worker/control.py), tears the process group
down, points MASTER_ADDR / MASTER_PORT at the new rendezvous and calls `main` again. The
survivors keep their process, their imported modules and their warm caches; the
replacement is the only cold start.

What `main` must do to be re-entrant: init the process group itself from the environment,
reload its state (the newest checkpoint) on every entry, keep no state across entries that
depends on the old group, and let BaseException through. docs/operator-reexecution.md has
the rules. Without the launcher, or with the restart off, run_resilient only calls `main`.
Standard library only (torch.distributed is torn down when the script imported it).
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from trainguard.worker import channel, control
from trainguard.worker.contract import (
    ENV_IN_PROCESS,
    ENV_IN_PROCESS_TIMEOUT,
    ENV_MASTER_ADDR,
    ENV_MASTER_PORT,
    ENV_PG_GENERATION,
    ControlKind,
    MessageKind,
)
from trainguard.worker.progress import phase
from trainguard.worker.transient import is_transient

T = TypeVar("T")
_hooks: list[weakref.WeakMethod[Callable[[], None]]] = []


def on_restart(method: Callable[[], None]) -> None:
    """Call the bound `method` when this process restarts in place, before the group is torn
    down (a Checkpointer gives up its save in flight: a rank that died never writes its
    part). Held weakly: a hook of an object that is gone is dropped."""
    _hooks.append(weakref.WeakMethod(method))


def run_resilient(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call `fn(*args, **kwargs)`; after a peer's death or hang, re-enter it in this process
    on the launcher's word. See the module docstring."""
    global _running
    box = control.inbox() if os.environ.get(ENV_IN_PROCESS) == "1" else None
    if box is None:
        return fn(*args, **kwargs)
    generation = control.pg_generation()
    timeout_s = control.env_float(ENV_IN_PROCESS_TIMEOUT, 60.0)
    restart_s: float | None = None
    if generation > 0:  # a replacement: the line marks where its rank recovered (its log's
        # earlier lines are its dead process's: diagnosis/survived.py, RECOVERY_PATTERN)
        _say(f"started in place of a failed process on process group generation {generation}")
    while True:
        channel.send(MessageKind.RESILIENT, generation=generation, restart_s=restart_s)
        try:
            _running = (box, generation)
            return fn(*args, **kwargs)
        except control.RestartRequested as r:
            verdict = r.verdict
        except Exception as e:
            failed_at = time.time()  # the fault's time in the record, not the verdict's
            if not is_transient(e):
                raise  # the script's own error: this process ends; the ladder decides
            verdict = _await_restart(box, generation, e, timeout_s, failed_at)
        finally:
            _running = None
        t0 = time.monotonic()
        _tear_down()
        generation = int(verdict["generation"])
        os.environ[ENV_MASTER_ADDR] = str(verdict["master_addr"])
        os.environ[ENV_MASTER_PORT] = str(verdict["master_port"])
        os.environ[ENV_PG_GENERATION] = str(generation)
        restart_s = round(time.monotonic() - t0, 6)
        _say(f"restarting in place on process group generation {generation} "
             f"({verdict['master_addr']}:{verdict['master_port']}), torn down in "
             f"{restart_s:.3f}s")


_running: tuple[control.Inbox, int] | None = None  # run_resilient's inbox and generation


def restart_if_asked() -> None:
    """Raise RestartRequested when the launcher's RESTART onto a newer process group is here
    already: for a wait outside any collective, which no dead peer breaks (a synchronous
    save's commit waiting for the part of a rank that died: walk-through 34 #8, the survivor
    waited 300 s while the replacement waited for it). Only inside run_resilient, on the main
    thread (a save's thread must not take the verdict run_resilient waits for)."""
    running = _running
    if running is None or threading.current_thread() is not threading.main_thread():
        return
    box, generation = running
    v = box.take(lambda v: control.newer_restart(v, generation))
    if v is not None:
        raise control.RestartRequested(v)


def _await_restart(box: control.Inbox, generation: int, error: Exception,
                   timeout_s: float, failed_at: float) -> dict[str, Any]:
    """The launcher's RESTART after `error` broke the group (at `failed_at`, Unix time);
    raises `error` on NO_RESTART or when none comes within `timeout_s`."""
    text, first = control.error_text(error)
    _say(f"the process group failed under this rank ({first}); waiting for the launcher")

    def accept(v: dict[str, Any]) -> bool:
        return control.newer_restart(v, generation) or bool(
            v["kind"] == ControlKind.NO_RESTART and v["generation"] >= generation)

    with phase("in_process_restart", timeout_s=timeout_s + 10):  # a wait, not a hang
        v = box.wait(accept, timeout_s, lambda: channel.send(
            MessageKind.RESTART_WAITING, generation=generation, error=text,
            failed_at=failed_at))
    if v is not None and v["kind"] == ControlKind.RESTART:
        return v
    _say(f"no in-process restart: {v['reason'] if v else f'no verdict within {timeout_s:g}s'}")
    raise error


def _tear_down() -> None:
    """Run the restart hooks, destroy what is left of the old process group (it is broken)
    and drop its objects."""
    hooks, _hooks[:] = list(_hooks), []
    for ref in hooks:
        fn = ref()
        if fn is not None:
            try:
                fn()
            except Exception as e:  # a hook must not stop the restart
                _say(f"a restart hook failed: {type(e).__name__}: {e}")
    dist = sys.modules.get("torch.distributed")
    if dist is not None:
        with contextlib.suppress(Exception):
            if dist.is_available() and dist.is_initialized():
                dist.destroy_process_group()
        _forget_group_names()
    gc.collect()


def _forget_group_names() -> None:
    """Name the next default group as a fresh process does ("0"). An init_process_group that
    failed (a re-formed group's rendezvous that timed out) took a name from torch's counter
    and never became the default group, so no destroy_process_group resets the counter (only
    a destroy of the default group does); a fresh replacement then joins "0" while this
    process joins "1", and gloo's rendezvous keys differ: every rank waits in
    init_process_group (review 37 #2). torch has no public reset: `_world.group_count` is
    what destroy_process_group sets; without it (another torch) nothing is done."""
    with contextlib.suppress(Exception):  # (KeyError, AttributeError: another torch)
        world = sys.modules["torch.distributed.distributed_c10d"]._world
        if not sys.modules["torch.distributed"].is_initialized() and world.group_count:
            world.group_count = 0


def _say(line: str) -> None:
    control.say("resilient", line)
