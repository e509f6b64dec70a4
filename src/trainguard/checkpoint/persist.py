"""`python -m trainguard.checkpoint.persist REGION LOCATION WORLD_SIZE [AT_MOST]`: save at
breakpoint.

Run by the node agent when a worker died: writes the newest snapshot that every rank of the
job holds in the node's memory region to storage, as a normal checkpoint (the same files,
manifest and commit as a save by the workers), unless storage has that step or a newer one
already. Each slot read is locked shared: a restarted worker skips a snapshot into it rather
than tear the copy. Reports CHECKPOINT_SAVED (source "memory") through the agent's channel.

A multi-node job's save at breakpoint (a node was lost) is one such save spread over the
nodes: `--rank R=DIR` (repeated) writes only those ranks' snapshots of exactly AT_MOST, each
from its directory (a node's own region, or the `peer/` copies a buddy keeps of the lost
node's ranks), under the save `--token` every node was given; the node with rank 0 commits
once every part is in storage, and reports `--source`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

from trainguard import __version__
from trainguard.checkpoint.errors import CheckpointError
from trainguard.checkpoint.loading import newest_valid_step
from trainguard.checkpoint.memory import read_entry
from trainguard.checkpoint.memory_format import agreed_step, loadable, read_manifest
from trainguard.checkpoint.saving import SaveJob, SaveResult, run_save
from trainguard.checkpoint.state import BufferPool, stage
from trainguard.checkpoint.storage import Storage
from trainguard.worker import channel
from trainguard.worker.contract import ENV_RUN_ID, SOURCE_MEMORY, SOURCE_PEER, MessageKind

log = logging.getLogger("trainguard.persist")

COMMIT_TIMEOUT_S = 60.0


def persist(region: str, location: str, world_size: int, run_id: str,
            at_most: int | None = None) -> int | None:
    """The step committed to storage, or None when there was nothing newer to persist; only
    snapshots of steps up to `at_most` count (the attempt that died: the restarted workers'
    newer snapshots are theirs to save)."""
    return persist_ranks({r: region for r in range(world_size)}, location, world_size, run_id,
                         at_most)


def persist_ranks(sources: dict[int, str], location: str, world_size: int, run_id: str,
                  at_most: int | None = None, exact: bool = False, token: str | None = None,
                  source: str = SOURCE_MEMORY) -> int | None:
    """Write the snapshots of the ranks of `sources` (rank -> the directory holding them) of
    their newest common step up to `at_most` (`exact`: of that step, else nothing); commit
    when rank 0 is among them. The step written, or None."""
    t0 = time.monotonic()
    per_rank = {r: loadable(d, r, world_size, run_id) for r, d in sorted(sources.items())}
    step = agreed_step([[s for s in p if at_most is None or s <= at_most]
                        for p in per_rank.values()])
    if step is None or (exact and step != at_most):
        log.info("no snapshot of step %s that every rank of %s holds: nothing to persist",
                 at_most if exact else "any", sorted(sources))
        return None
    st = Storage(location)
    stored = newest_valid_step(st)
    if stored is not None and stored >= step:
        log.info("storage holds step %s, as new as memory's %s: nothing to persist",
                 stored, step)
        return None
    token = token or f"memory-{run_id}-{step}-{int(time.time())}"
    first = min(sources)
    manifest = read_manifest(sources[first], first)
    keep = manifest.keep if manifest is not None else 3  # as the workers' Checkpointer prunes
    pool = BufferPool()

    def committed(result: SaveResult) -> None:  # durable: told before `latest` and pruning
        channel.send(MessageKind.CHECKPOINT_SAVED, step=step, location=st.location,
                     bytes=result.total_bytes, write_s=round(time.monotonic() - t0, 4),
                     blocked_s=0.0, source=source, missing_ranks=[])

    for rank in sorted(sources, key=lambda r: r == 0):  # rank 0 last: it commits
        tree = read_entry(sources[rank], rank, per_rank[rank][step], lock=True)
        job = SaveJob(storage=st, step=step, rank=rank, world_size=world_size, token=token,
                      replicated=stage(tree["replicated"], pool, "r") if rank == 0 else None,
                      per_rank=stage(tree["rank"], pool, "p"), keep=keep,
                      commit_timeout_s=COMMIT_TIMEOUT_S, library_version=__version__,
                      run_id=run_id, on_commit=committed)
        try:
            result = run_save(job)
        except (CheckpointError, OSError) as e:  # an event, not only persist.log (walk-
            channel.send(MessageKind.CHECKPOINT_SAVE_FAILED, step=step,  # through 27)
                         error=str(e)[:500], location=st.location, source=source)
            raise
        if result.already_valid:
            return None
    if 0 not in sources:
        log.info("wrote the memory snapshots of rank(s) %s of step %s to %s (the node with "
                 "rank 0 commits)", sorted(sources), step, st.location)
        return step
    log.info("persisted the memory snapshot of step %s to %s", step, st.location)
    return step


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m trainguard.checkpoint.persist")
    p.add_argument("region")
    p.add_argument("location")
    p.add_argument("world_size", type=int)
    p.add_argument("at_most", type=int, nargs="?")
    p.add_argument("--rank", action="append", default=[], metavar="R=DIR",
                   help="only this rank, from DIR, of exactly AT_MOST (repeated)")
    p.add_argument("--token", help="the save's token, the same on every node")
    p.add_argument("--source", default=SOURCE_MEMORY, choices=(SOURCE_MEMORY, SOURCE_PEER))
    return p


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="[trainguard.persist] %(message)s",
                        stream=sys.stderr)
    args = _parser().parse_args(argv[1:])
    run_id = os.environ.get(ENV_RUN_ID, "")
    try:
        if args.rank:
            sources = {int(r): d for r, _, d in (x.partition("=") for x in args.rank)}
            persist_ranks(sources, args.location, args.world_size, run_id, args.at_most,
                          exact=True, token=args.token, source=args.source)
        else:
            persist(args.region, args.location, args.world_size, run_id, args.at_most)
    except (CheckpointError, OSError, ValueError) as e:
        print(f"[trainguard.persist] not persisted: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
