"""Drain on request, for the trainer integrations: when trainguard asks the job to stop
(`trainguard stop`, SIGTERM or SIGINT to its launcher), save a checkpoint at the next step
end, then exit.

The launcher sends a DRAIN verdict (worker.contract.ControlKind) to each rank's drain socket,
which only a process with this module's `Drain` binds (a script that does not drain gets no
verdict, and the launcher does not wait for it). The save is collective, and the verdict
reaches the ranks at slightly different times, so the ranks vote: at each step end every
rank adds its "asked" flag to an all-reduce (MAX) on a gloo group of its own, started
asynchronously and read at the next step end. Every rank sees the same result at the same
step, no step waits on the vote, and no accelerator is synchronised for it.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import torch
import torch.distributed as dist

from trainguard.worker.contract import ENV_RANK, ENV_SOCKET, ControlKind, control_socket
from trainguard.worker.control import Inbox, say, unreachable

EXIT_CODE = 128 + signal.SIGTERM  # a drained rank exits as a rank stopped by SIGTERM


class Drain:
    """One per callback: `start()` at train begin, `step_end()` at each step end (both on
    every rank), `finish()` at train end."""

    def __init__(self) -> None:
        self._started = False
        self._inbox: Inbox | None = None
        self._group: Any = None  # the vote's process group (gloo); None: a single rank
        self._flag = torch.zeros(1, dtype=torch.int32)
        self._vote: Any = None  # the all-reduce in flight
        self.reason: str | None = None  # why this rank was asked
        self.agreed = False  # every rank drains at this step end
        self.drained_at: int | None = None  # the step the drain saved

    def start(self) -> None:
        """Listen for a drain and (several ranks) make the vote's group: collective, so every
        rank calls it at the same point. Outside trainguard it does nothing."""
        if self._started:
            return
        self._started = True
        name, rank = os.environ.get(ENV_SOCKET), os.environ.get(ENV_RANK, "")
        if not name or not rank.isdigit():
            return
        try:
            self._inbox = Inbox(control_socket(name, int(rank), ControlKind.DRAIN))
        except OSError as e:
            unreachable("drain", "the drain on a stop", "drain requests do not reach it: a "
                        "stop ends this rank without a save", e)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            try:
                self._group = dist.new_group(backend="gloo")
            except (RuntimeError, ValueError) as e:  # a torch built without gloo
                say("drain", f"no gloo group for the drain vote ({e}): a stop ends this rank "
                    "without a save")
                self._inbox = None

    def step_end(self) -> bool:
        """True, on every rank at the same step end, once any rank was asked to drain."""
        if self.agreed:
            return True
        if self._inbox is not None and self.reason is None:
            v = self._inbox.take(lambda v: v["kind"] == ControlKind.DRAIN)
            if v is not None:
                self.reason = str(v["reason"])
                say("drain", f"asked to drain ({self.reason}): saving at the next step end "
                    "every rank agrees on, then exiting")
        if self._group is None:
            self.agreed = self.reason is not None
            return self.agreed
        if self._vote is not None:
            self._vote.wait()
            self.agreed = bool(self._flag.item())
        if not self.agreed:
            self._flag = torch.tensor([int(self.reason is not None)], dtype=torch.int32)
            self._vote = dist.all_reduce(self._flag, op=dist.ReduceOp.MAX, group=self._group,
                                         async_op=True)
        return self.agreed

    def on_exit(self) -> str:
        """What a drain checkpoint's CheckpointSaved says about why it was saved."""
        return f"drained: {self.reason or 'another rank was asked to stop'}"

    def finish(self) -> None:
        """A drained rank exits (EXIT_CODE) instead of going on with the script, which would
        take the training as finished."""
        if self.drained_at is not None:
            say("drain", f"drained at step {self.drained_at}: its checkpoint is committed; "
                f"exiting with {EXIT_CODE}")
            raise SystemExit(EXIT_CODE)
