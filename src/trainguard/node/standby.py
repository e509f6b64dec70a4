"""The node's pool of pre-warmed standby workers (worker/standby.py), owned by the agent.

A restart's new processes are mostly their own start: an interpreter, `import torch`, DDP's
`_dynamo`, DCP. A standby has done all that before it is needed, so a restarted rank (a
process restart, a restart upon suspension, an in-process restart's replacement) takes one
and starts its script at once. Standbys are spawned, never forked, with the job's worker
environment; one is used only when the rank's environment matches the one it was started
with in everything but the per-rank and per-attempt variables (PER_RANK_ENV), and when the
worker runs the same interpreter with the same flags (`python -u script` or `-m module`; a
`--no-python` program never). The pool holds as many as the node has ranks and is refilled
REFILL_DELAY_S after a take (the new worker's own start comes first).

A standby says when its imports are done (one byte on a pipe the pool gave it): `warm()`
counts those (status shows them as ready, the others as warming), and a take prefers them.
One taken while still importing would go on importing at the standby's lower priority
(worker/standby.py reads its assignment only once warm): the pool raises every thread of it
back to the agent's priority at once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass

from trainguard.node import procs
from trainguard.worker import contract as c
from trainguard.worker.standby import READY_FD, restore_priority

log = logging.getLogger(__name__)

REFILL_DELAY_S = 5.0  # after a take: the new worker's own start goes first
FILL_AFTER_S = 10.0  # after the attempt's first step: the job's own start goes first
MAX_LEARNED = 64  # modules learned from the workers' imports
# what a standby imports before it is needed (the job's script imports the rest itself)
DEFAULT_IMPORTS = ("torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo",
                   "torch.distributed.checkpoint", "trainguard.checkpoint",
                   "trainguard.worker.step")
# differ between ranks and attempts of one job: read by the script at run time, not at import
PER_RANK_ENV = frozenset({
    c.ENV_RANK, c.ENV_LOCAL_RANK, c.ENV_ROLE_RANK, c.ENV_MASTER_ADDR, c.ENV_MASTER_PORT,
    c.ENV_RESTART_COUNT, c.ENV_ERROR_FILE, c.ENV_PROCESS_START_COUNT, c.ENV_SCHEDULE_COUNT,
    c.ENV_ATTEMPT, c.ENV_PG_GENERATION, c.ENV_DEAD_RANKS, c.ENV_GROUP_RANK,
    c.ENV_LOCAL_WORLD_SIZE, c.ENV_GROUP_WORLD_SIZE, c.ENV_WORLD_SIZE, c.ENV_ROLE_WORLD_SIZE})


def _shared(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in PER_RANK_ENV and k != c.ENV_MARKER}


def interpreter(argv: list[str]) -> tuple[list[str], list[str]] | None:
    """(the interpreter and its flags, what follows) for `python -u script ...` or
    `python -u -m module ...`; None for anything a standby cannot run."""
    if len(argv) < 3 or argv[0] != sys.executable or argv[1] != "-u":
        return None
    rest = argv[2:]
    if rest[0] == "-m":
        return (argv[:2], rest) if len(rest) >= 2 else None
    return None if rest[0].startswith("-") else (argv[:2], rest)


@dataclass
class _Standby:
    proc: subprocess.Popen[bytes]
    env: dict[str, str]  # what it was started with, per-rank variables left out
    cwd: str
    ready_fd: int | None  # the pipe it writes one byte to once warm (closed once read)
    warm: bool = False

    def poll_warm(self) -> bool:
        """Whether its imports are done (reads the pipe without blocking)."""
        if not self.warm and self.ready_fd is not None:
            try:
                said = os.read(self.ready_fd, 1)
            except BlockingIOError:
                return False
            except OSError:
                said = b""
            self.warm = said == b"1"
            self.close_pipe()
        return self.warm

    def close_pipe(self) -> None:
        if self.ready_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.ready_fd)
            self.ready_fd = None


class StandbyPool:
    def __init__(self, guardian: procs.Guardian, imports: tuple[str, ...] = DEFAULT_IMPORTS,
                 ) -> None:
        self._guardian = guardian
        self._imports = imports
        self._extra: list[str] = []  # --prewarm-imports, then what the workers imported
        self._ready: list[_Standby] = []
        self._want = 0
        self._template: tuple[list[str], dict[str, str], str] | None = None
        self._taken_at = 0.0
        self.taken = 0  # standbys that became workers

    def __len__(self) -> int:
        return len(self._ready)

    def pids(self) -> list[int]:
        """The standbys alive now, warm or still importing (status shows their memory)."""
        return [s.proc.pid for s in self._ready if s.proc.poll() is None]

    def warm(self) -> int:
        """How many of them have done their imports."""
        return sum(1 for s in self._ready if s.proc.poll() is None and s.poll_warm())

    def configure(self, size: int, argv: list[str], env: dict[str, str], cwd: str,
                  imports: list[str] | None = None) -> None:
        """Keep `size` standbys for workers started as `argv` in `env` (one rank's: its
        per-rank variables do not matter) and `cwd`, importing `imports` too; ones that no
        longer match go."""
        self.learn(imports or [])
        split = interpreter(argv)
        if split is None:
            size = 0
        shared = _shared(env)
        for s in [s for s in self._ready if s.env != shared or s.cwd != cwd]:
            self._ready.remove(s)
            self._end(s)
        self._want = size
        self._template = (split[0], env, cwd) if split is not None else None

    def take(self, argv: list[str], env: dict[str, str], cwd: str
             ) -> subprocess.Popen[bytes] | None:
        """A live matching standby, handed this worker's assignment; None: start it cold."""
        split = interpreter(argv) if self._ready else None
        if split is None:
            return None
        shared = _shared(env)
        self._ready.sort(key=lambda s: not s.poll_warm())  # the warm ones first
        while self._ready:
            s = self._ready.pop(0)
            if s.proc.poll() is not None or s.env != shared or s.cwd != cwd:
                self._end(s)
                continue
            if not s.poll_warm():  # still importing, at the standby's lower priority
                restore_priority(os.getpriority(os.PRIO_PROCESS, 0), s.proc.pid)
            s.close_pipe()
            try:
                assert s.proc.stdin is not None
                s.proc.stdin.write(json.dumps({"argv": split[1], "env": env, "cwd": cwd})
                                   .encode() + b"\n")
                s.proc.stdin.close()
                s.proc.stdin = None  # as a worker's: no pipe of ours to its stdin
            except OSError as e:
                log.info("standby pid %s could not take its assignment (%s)", s.proc.pid, e)
                self._end(s)
                continue
            self.taken += 1
            self._taken_at = time.monotonic()
            return s.proc
        return None

    def learn(self, modules: list[str]) -> None:
        """Standbys spawned from now on import `modules` as well (installed packages a
        worker of the job imported; at most MAX_LEARNED)."""
        for m in modules:
            if m not in self._imports and m not in self._extra and len(self._extra) < \
                    MAX_LEARNED and all(part.isidentifier() for part in m.split(".")):
                self._extra.append(m)

    @property
    def imports(self) -> tuple[str, ...]:
        return (*self._imports, *self._extra)

    def maintain(self, running_s: float | None) -> None:
        """Spawn a standby when the pool is short: `running_s` is how long ago the attempt's
        first step was seen (None: not yet)."""
        if self._template is None or len(self._ready) >= self._want:
            return
        if running_s is None or running_s < FILL_AFTER_S or \
                time.monotonic() - self._taken_at < REFILL_DELAY_S:
            return
        interp, env, cwd = self._template
        # without the job's marker: stopping an attempt (procs.kill_marked) leaves it alone;
        # the guardian still ends it with the launcher, and the assignment brings the marker
        env = {k: v for k, v in env.items() if k != c.ENV_MARKER}
        r, w = os.pipe()
        os.set_blocking(r, False)
        try:
            proc = procs.spawn([*interp, "-m", "trainguard.worker.standby", f"{READY_FD}{w}",
                                *self.imports], env, cwd, stdin=subprocess.PIPE,
                               pass_fds=(w,))
        except OSError as e:
            os.close(r)
            log.warning("cannot start a standby worker (%s); restarts start cold", e)
            self._want = 0
            return
        finally:
            os.close(w)
        self._guardian.watch(proc.pid)
        self._ready.append(_Standby(proc, _shared(env), cwd, r))

    def close(self) -> None:
        """End every unused standby (its group), and reap it."""
        ready, self._ready, self._want = self._ready, [], 0
        for s in ready:
            self._end(s)

    def _end(self, s: _Standby) -> None:
        s.close_pipe()
        with contextlib.suppress(OSError):
            if s.proc.stdin is not None:
                s.proc.stdin.close()  # an unused standby exits by itself on EOF
        procs.stop_groups([s.proc], 0.0)
        for pipe in (s.proc.stdout, s.proc.stderr):
            with contextlib.suppress(OSError):
                if pipe is not None:
                    pipe.close()
        self._guardian.forget(s.proc.pid)
