"""`python -m trainguard.checkpoint.persist REGION LOCATION WORLD_SIZE [AT_MOST]`: save at
breakpoint.

Run by the node agent when a worker died: writes the newest snapshot that every rank of the
job holds in the node's memory region to storage, as a normal checkpoint (the same files,
manifest and commit as a save by the workers), unless storage has that step or a newer one
already. It needs every rank's snapshot in this region (one node; a job over several nodes
keeps its memory snapshots on each node, and this does nothing there). Each slot read is
locked shared: a restarted worker skips a snapshot into it rather than tear the copy.
Reports CHECKPOINT_SAVED (source "memory") through the agent's channel.
"""

from __future__ import annotations

import logging
import sys
import time

from trainguard import __version__
from trainguard.checkpoint.errors import CheckpointError
from trainguard.checkpoint.loading import newest_valid_step
from trainguard.checkpoint.memory import read_entry
from trainguard.checkpoint.memory_format import agreed_step, loadable, read_manifest
from trainguard.checkpoint.saving import SaveJob, run_save
from trainguard.checkpoint.state import BufferPool, stage
from trainguard.checkpoint.storage import Storage
from trainguard.worker import channel
from trainguard.worker.contract import ENV_RUN_ID, SOURCE_MEMORY, MessageKind

log = logging.getLogger("trainguard.persist")

COMMIT_TIMEOUT_S = 60.0


def persist(region: str, location: str, world_size: int, run_id: str,
            at_most: int | None = None) -> int | None:
    """The step committed to storage, or None when there was nothing newer to persist; only
    snapshots of steps up to `at_most` count (the attempt that died: the restarted workers'
    newer snapshots are theirs to save)."""
    t0 = time.monotonic()
    per_rank = [loadable(region, r, world_size, run_id) for r in range(world_size)]
    step = agreed_step([[s for s in p if at_most is None or s <= at_most] for p in per_rank])
    if step is None:
        log.info("no snapshot that every rank holds in %s: nothing to persist", region)
        return None
    st = Storage(location)
    stored = newest_valid_step(st)
    if stored is not None and stored >= step:
        log.info("storage holds step %s, as new as memory's %s: nothing to persist",
                 stored, step)
        return None
    token = f"memory-{run_id}-{step}-{int(time.time())}"
    manifest = read_manifest(region, 0)
    keep = manifest.keep if manifest is not None else 3  # as the workers' Checkpointer prunes
    pool = BufferPool()
    written = 0
    for rank in [*range(1, world_size), 0]:  # rank 0 last: it commits
        tree = read_entry(region, rank, per_rank[rank][step], lock=True)
        job = SaveJob(storage=st, step=step, rank=rank, world_size=world_size, token=token,
                      replicated=stage(tree["replicated"], pool, "r") if rank == 0 else None,
                      per_rank=stage(tree["rank"], pool, "p"), keep=keep,
                      commit_timeout_s=COMMIT_TIMEOUT_S, library_version=__version__)
        result = run_save(job)
        written += result.bytes_written
        if result.already_valid:
            return None
    channel.send(MessageKind.CHECKPOINT_SAVED, step=step, location=st.location,
                 bytes=written, write_s=round(time.monotonic() - t0, 4), blocked_s=0.0,
                 source=SOURCE_MEMORY, missing_ranks=[])
    log.info("persisted the memory snapshot of step %s to %s", step, st.location)
    return step


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="[trainguard.persist] %(message)s",
                        stream=sys.stderr)
    if len(argv) not in (4, 5) or not all(a.isdigit() for a in argv[3:]):
        print("usage: python -m trainguard.checkpoint.persist REGION LOCATION WORLD_SIZE "
              "[AT_MOST]", file=sys.stderr)
        return 2
    import os

    try:
        persist(argv[1], argv[2], int(argv[3]), os.environ.get(ENV_RUN_ID, ""),
                int(argv[4]) if len(argv) == 5 else None)
    except (CheckpointError, OSError, ValueError) as e:
        print(f"[trainguard.persist] not persisted: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
