"""One save, run in the background: write this rank's files, and on rank 0 commit.

Protocol (docs/checkpoints.md): every rank writes its files into the save's staging dir,
each fsynced, then its part list (`rank-R.part.json`, written atomically). Rank 0 waits
for every rank's part list through the storage itself (no collective, so a rank that dies
mid-save cannot deadlock anyone: the commit times out), writes the manifest, publishes
the directory by atomic rename, then advances `latest` and prunes.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import IO, Any, cast

import torch

from trainguard.checkpoint.errors import CheckpointError
from trainguard.checkpoint.manifest import (
    LATEST,
    MANIFEST,
    REPLICATED,
    Manifest,
    Status,
    Verdict,
    check_sizes,
    check_step,
    part_file,
    parts_to_files,
    prune_plan,
    rank_file,
    step_dir,
)
from trainguard.checkpoint.sharing import DROP, LEAVE, OWN, Sharers, other_writer
from trainguard.checkpoint.storage import Storage

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SaveJob:
    storage: Storage
    step: int
    rank: int
    world_size: int
    token: str
    replicated: dict[str, Any] | None  # staged; rank 0 only
    per_rank: dict[str, Any]  # staged
    keep: int
    commit_timeout_s: float
    library_version: str
    allow_missing: bool = False  # save on the way out: commit without ranks that died
    dead: Callable[[], set[int]] | None = None  # ranks known dead: no need to wait for them
    # raises to leave the wait for the other ranks' parts (an in-process restart under way)
    interrupt: Callable[[], None] | None = None
    extra_files: tuple[dict[str, Any], ...] = ()  # already written (sharded/, by DCP)
    rewrite: bool = False  # the step exists but was found corrupt on load: write it anew
    bad_steps: frozenset[int] = frozenset()  # found corrupt on load: never count as valid
    run_id: str = ""  # the job's (the launcher's run id): recorded in the manifest
    # called on rank 0 once the checkpoint is durable, before `latest` and pruning (a rank
    # killed in between must not lose the commit's report; walk-through 31 #14)
    on_commit: Callable[[SaveResult], None] | None = None


@dataclass(frozen=True)
class SaveResult:
    step: int
    bytes_written: int
    write_s: float
    committed: bool  # True on rank 0 once the checkpoint is published
    missing_ranks: tuple[int, ...] = ()
    already_valid: bool = False  # the step was committed before: nothing was written
    total_bytes: int | None = None  # the checkpoint's size (its manifest's files), rank 0
    other_writer: str | None = None  # already_valid: the other job that committed it
    # committed, but the dir holds steps another job committed that the prune left alone
    # (checkpoint/sharing.py): the newest (step, its job)
    of_other_job: tuple[int, str] | None = None


def run_save(job: SaveJob) -> SaveResult:
    t0 = time.monotonic()
    st = job.storage
    staging = st.staging_dir(job.step, job.token)
    verdict, existing = quick_verdict(st, job.step)
    if not job.rewrite and verdict.status == Status.VALID and existing is not None:
        # Re-saving a committed step (a job resumed from an older checkpoint) could only
        # put the valid one at risk: every rank sees it and writes nothing.
        return SaveResult(job.step, 0, time.monotonic() - t0, committed=job.rank == 0,
                          already_valid=True, total_bytes=_total(existing),
                          other_writer=other_writer(existing, job.run_id))
    published = False
    try:
        if job.rewrite and job.rank == 0 and not st.local:
            st.remove(f"{staging}/{MANIFEST}")  # in place on an object store: unpublish first
        files = []
        if job.replicated is not None:
            files.append(_write(st, f"{staging}/{REPLICATED}", job.replicated))
        files.append(_write(st, f"{staging}/{rank_file(job.rank)}", job.per_rank))
        files.extend(job.extra_files)
        part = {"token": job.token, "files": files}  # a killed attempt's list is not ours
        st.write_atomic(f"{staging}/{part_file(job.rank)}", json.dumps(part).encode())
        written = sum(int(f["size"]) for f in files)
        if job.rank != 0:
            return SaveResult(job.step, written, time.monotonic() - t0, committed=False)
        parts = wait_for_parts(st, staging, job.world_size, job.commit_timeout_s,
                               job.allow_missing, job.dead, job.token, job.interrupt)
        missing = tuple(r for r in range(job.world_size) if r not in parts)
        manifest = Manifest(step=job.step, world_size=job.world_size,
                            files=parts_to_files(parts), library_version=job.library_version,
                            created_at=time.time(), missing_ranks=missing,
                            extra={"run_id": job.run_id} if job.run_id else {})
        st.write_atomic(f"{staging}/{MANIFEST}", manifest.to_json())
        st.publish(staging, job.step)
        published = True
        result = SaveResult(job.step, written, time.monotonic() - t0, committed=True,
                            missing_ranks=missing, total_bytes=_total(manifest))
        try:  # reported first: durable now, whatever happens to this rank next
            if job.on_commit is not None:
                job.on_commit(result)
        except Exception as e:
            log.warning("checkpoint of step %s is committed; reporting it failed: %s",
                        job.step, e)
        try:  # `latest` is a pointer for people, pruning tidies
            st.write_atomic(LATEST, step_dir(job.step).encode())
            theirs = prune(st, job.keep, committed=job.step, bad=job.bad_steps,
                           run_id=job.run_id)
            if theirs is not None:
                result = replace(result, of_other_job=theirs)
        except Exception as e:
            log.warning("checkpoint of step %s is committed, but updating latest or pruning "
                        "failed: %s", job.step, e)
        return result
    except BaseException:
        if job.rank == 0 and not published:
            try:  # leave no half-written checkpoint, free the space (disk full)
                st.remove(staging)
            except Exception as cleanup:  # storage gone: keep the error that caused this
                log.warning("could not remove the failed save's files: %s", cleanup)
        raise


def _total(manifest: Manifest) -> int:
    """A checkpoint's size: every rank's files, as its manifest lists them (walk-through 31
    #7: rank 0's own files were reported)."""
    return sum(f.size for f in manifest.files)


def _write(st: Storage, rel: str, tree: dict[str, Any]) -> dict[str, Any]:
    size, sha = st.write_stream(rel, lambda w: torch.save(tree, cast(IO[bytes], w)))
    return {"name": rel.rsplit("/", 1)[-1], "size": size, "sha256": sha}


def wait_for_parts(st: Storage, staging: str, world_size: int, timeout_s: float,
                   allow_missing: bool = False, dead: Callable[[], set[int]] | None = None,
                   token: str | None = None, interrupt: Callable[[], None] | None = None,
                   ) -> dict[int, list[dict[str, Any]]]:
    """Every rank's part list (of this save: `token`), polled from storage; after timeout_s,
    or as soon as a missing rank is known dead, a CheckpointError, or (allow_missing) the
    parts that are there. `interrupt` runs at each poll and may raise (to leave the wait)."""
    deadline = time.monotonic() + timeout_s
    delay = 0.02
    wanted = {part_file(r): r for r in range(world_size)}
    parts: dict[int, list[dict[str, Any]]] = {}
    while True:
        for name in st.sizes(staging):  # each part is read once, when it is complete
            r = wanted.get(name)
            if r is not None and r not in parts:
                files = _read_part(st, f"{staging}/{name}", token)
                if files is not None:
                    parts[r] = files
        missing = [r for r in range(world_size) if r not in parts]
        if not missing:
            return parts
        if interrupt is not None:
            interrupt()
        gone = dead() & set(missing) if dead is not None else set()
        if allow_missing and (time.monotonic() > deadline or set(missing) <= gone):
            return parts
        if gone:
            raise CheckpointError(f"rank(s) {', '.join(map(str, sorted(gone)))} died before "
                                  "finishing their part of the save; the save is abandoned")
        if time.monotonic() > deadline:
            raise CheckpointError(
                f"rank(s) {', '.join(map(str, missing))} did not finish their part of the save "
                f"within {timeout_s:g}s (a rank died or storage is slow); the save is abandoned")
        time.sleep(delay)
        delay = min(delay * 2, 0.5)


def _read_part(st: Storage, rel: str, token: str | None) -> list[dict[str, Any]] | None:
    """A rank's file list if it belongs to this save (`token`); None if not (yet)."""
    try:
        part = json.loads(st.read_bytes(rel))
    except (OSError, ValueError):
        return None  # being replaced, or broken: not ours yet
    if not isinstance(part, dict) or (token is not None and part.get("token") != token):
        return None  # a killed attempt's list, left in place on an object store
    return list(part["files"])


def quick_verdict(st: Storage, step: int) -> tuple[Verdict, Manifest | None]:
    """Manifest present and every file of the right size (checksums are checked on load)."""
    d = step_dir(step)
    try:
        raw = st.read_bytes(f"{d}/{MANIFEST}")
    except FileNotFoundError:
        return Verdict(step, Status.INCOMPLETE, "no manifest: the save did not finish"), None
    try:
        manifest = Manifest.from_json(raw)
    except ValueError as e:
        return Verdict(step, Status.CORRUPT, str(e)), None
    elsewhere = check_step(manifest, step)
    broken = check_sizes(manifest, st.tree_sizes(d))
    if elsewhere is not None or broken is not None:
        return Verdict(step, Status.CORRUPT, elsewhere or broken or "",
                       misplaced=elsewhere is not None and broken is None), manifest
    return Verdict(step, Status.VALID), manifest


def prune(st: Storage, keep: int, committed: int | None = None,
          bad: frozenset[int] = frozenset(), run_id: str = "") -> tuple[int, str] | None:
    """Delete beyond `keep` valid checkpoints and leftovers older than the newest valid one.

    `committed` (just written, checksums known good) is always kept; `bad` steps (checksums
    failed on load, sizes fine) never count as valid, so they cannot push good ones out.
    Steps another job (not `run_id`) committed are never counted; checkpoint/sharing.py
    says which are left alone (its newest, and all while it writes this dir too) and which
    deleted; the newest of a job that writes the dir too (step, run id) is returned, for the
    job to say it.
    """
    steps = st.steps()
    verdicts: list[Verdict] = []
    doomed: list[int] = []  # beyond the kept ones, and other jobs' steps to drop
    sharers = Sharers(st, run_id, committed)
    for i, s in enumerate(steps):
        if s in bad and s != committed:  # written anew now: valid (walk-through 35 F1)
            verdicts.append(Verdict(s, Status.CORRUPT, "checksum failed on load"))
        else:
            verdict, manifest = quick_verdict(st, s)
            how = sharers.sort(s, manifest)
            if how != OWN:
                doomed += [s] if how == DROP else []
                continue
            verdicts.append(verdict)
        kept = sum(v.status == Status.VALID for v in verdicts)
        if kept >= max(keep, 1) and (committed is None or s <= committed):
            doomed += [x for x in steps[i + 1:] if x != committed and (
                not run_id or sharers.sort(x, sharers.manifest(x)) != LEAVE)]
            break
    for step in prune_plan(verdicts, keep, newest_valid_in_use=committed) + doomed:
        log.debug("pruning checkpoint step %s", step)
        st.remove(step_dir(step))
    newest = max((v.step for v in verdicts if v.status == Status.VALID), default=None)
    for name in st.children():
        if name.startswith(f".{LATEST}.") and name.endswith(".tmp"):
            st.remove(name)  # a `latest` write killed before its rename (rank 0 writes alone)
        elif name.startswith((".tmp-step-", ".old-step-")) and newest is not None \
                and not sharers.other_launched():  # (else it may be the other job's save)
            # older steps' leftovers, and another attempt's save of the step just committed
            # (this save's own staging dir is step-N now; walk-through 31 #11)
            step_text = name.split("-")[2]
            if step_text.isdigit() and (int(step_text) < newest or int(step_text) == committed):
                st.remove(name)
    return sharers.kept
