"""The node agent's shared-memory region for its ranks' memory snapshots (checkpoint/memory.py).

The agent makes the region before its first workers start (when the job asked for memory
snapshots), hands its path to every worker (TRAINGUARD_MEMORY_DIR), and frees it when it
closes; the guardian frees it when the agent dies without closing (even by SIGKILL). When a
worker fails, the agent persists the ranks' newest common snapshot to storage in the
background (`python -m trainguard.checkpoint.persist`: torch is needed to write the
checkpoint format, and the agent never imports it) at a lower CPU priority (PERSIST_NICE):
the restart does not wait for it, and the restarted workers go first.

The region is a new directory of the job's user, mode 0700, its name with a random part
(memory_format.make_private, region_path): another local user can neither make it first nor
put anything in it (walk-through 32 #9: a region planted under the old, predictable name
was used as it was, and the ranks wrote their snapshots through its symlinks).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import subprocess
import sys
from pathlib import Path

from trainguard.checkpoint.memory_format import (
    DEFAULT_ROOT,
    free_region,
    make_private,
    not_private,
    region_path,
)
from trainguard.node import procs
from trainguard.protocol import PERSIST_WAIT_S, StartWorkers
from trainguard.worker.contract import (
    ENV_MARKER,
    ENV_MEMORY_DIR,
    ENV_MEMORY_EVERY,
    ENV_RANK,
    ENV_SHM_ROOT,
)

log = logging.getLogger(__name__)

# added to the persisting process's nice value: the restarted workers it runs beside (the
# restart does not wait for it) import and load first
PERSIST_NICE = 10


class MemoryRegion:
    def __init__(self, marker: str, node: str, guardian: procs.Guardian) -> None:
        root = os.environ.get(ENV_SHM_ROOT, DEFAULT_ROOT)
        self.path = region_path(root, marker, node)  # with a random part: not guessable
        self._guardian = guardian
        # freed if this agent dies, also when a restore made it (peer.store) before env did
        guardian.free_on_death(str(self.path))
        self._made = False
        self._persisting: subprocess.Popen[bytes] | None = None
        self._persist_log: Path | None = None

    def env(self, job_env: dict[str, str]) -> dict[str, str]:
        """The variables a worker gets: the region's path, made now, when the job takes
        memory snapshots; nothing otherwise."""
        if job_env.get(ENV_MEMORY_EVERY, "0") in ("", "0"):
            return {}
        if not self.ensure():
            return {ENV_MEMORY_EVERY: "0"}
        return {ENV_MEMORY_DIR: str(self.path)}

    def ensure(self) -> bool:
        """Make the region unless this agent made it already; False (warned) when it cannot
        be made. One a restore made (`peer.store`: onto a spare, before its first workers
        start; review of walk-through 32 #5) is taken when it is this user's and private:
        no other user can make a directory of this user's, and the name has a random part."""
        if self._made:
            return True
        try:  # a new directory, private: never one someone made first (#9 of walk 32)
            make_private(self.path)
        except FileNotFoundError as e:
            log.warning("no memory snapshots on this node: cannot make %s (%s). Fix: "
                        "mount /dev/shm, or set %s to a tmpfs directory", self.path,
                        e.strerror, ENV_SHM_ROOT)
            return False
        except OSError as e:
            if e.errno != errno.EEXIST or not_private(self.path) is not None:
                log.warning("no memory snapshots on this node: cannot make %s: %s",
                            self.path, e.strerror or e)
                return False
        self._made = True
        return True

    def held(self) -> Path | None:
        """The region's path while it exists (status measures it), else None."""
        return self.path if self._made else None

    def persist(self, worker_env: dict[str, str], cmd: StartWorkers, at_most: int | None,
                log_file: Path, spread: list[str] | None = None) -> bool:
        """Start persisting the ranks' newest common snapshot of a step up to `at_most` (the
        dying attempt's last step: not one the restarted workers take meanwhile), one at a
        time, its lines appended to `log_file`; False when one is still running or there is
        no region. `spread`: this node's part of a save over several nodes (persist.py's
        `--rank R=DIR --token T --source S` arguments)."""
        location, world_size = cmd.checkpoint_dir, cmd.world_size
        if not self._made or self.persisting():
            return False
        # not a worker: no rank, and no marker (stopping the workers kills marked strays)
        env = {k: v for k, v in worker_env.items() if k not in (ENV_RANK, ENV_MARKER)}
        argv = [sys.executable, "-m", "trainguard.checkpoint.persist", str(self.path),
                location, str(world_size), *([] if at_most is None else [str(at_most)]),
                *(spread or [])]
        try:
            with open(log_file, "ab") as out:
                self._persisting = subprocess.Popen(
                    argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                    start_new_session=True)
        except OSError as e:
            log.warning("cannot persist the memory snapshots: %s", e)
            return False
        with contextlib.suppress(OSError):  # before its interpreter starts a thread
            os.setpriority(os.PRIO_PROCESS, self._persisting.pid,
                           min(os.getpriority(os.PRIO_PROCESS, 0) + PERSIST_NICE, 19))
        self._guardian.watch(self._persisting.pid)
        self._persist_log = log_file
        log.info("persisting the memory snapshots of %s (pid %d, log %s)", self.path,
                 self._persisting.pid, log_file)
        return True

    def persisting(self) -> bool:
        return self._persisting is not None and self._persisting.poll() is None

    def reap(self) -> None:
        """Log the end of a persistence that finished (non-blocking)."""
        p = self._persisting
        if p is None or p.poll() is None:
            return
        self._persisting = None
        self._guardian.forget(p.pid)
        if p.returncode != 0:
            log.warning("persisting the memory snapshots failed (exit %s): see %s",
                        p.returncode, self._persist_log)

    def close(self) -> None:
        """Let a persistence in flight finish (bounded), then free the region."""
        p = self._persisting
        if p is not None:
            try:
                p.wait(timeout=PERSIST_WAIT_S)
            except subprocess.TimeoutExpired:
                log.warning("persisting the memory snapshots took over %ss: stopped",
                            PERSIST_WAIT_S)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, 9)
                p.wait()
            self.reap()
        free_region(self.path)  # made here or by a restore (peer.store); ours alone
        self._made = False
