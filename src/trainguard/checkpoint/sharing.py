"""Two jobs in one checkpoint dir: which of the other job's steps a save leaves alone.

Two jobs should never write one dir (the launch refuses a dir another running job writes,
where it can tell: docs/checkpoints.md). Where they do anyway (the other job's launcher on
another machine, an object store with no lock), each save's prune (checkpoint/saving.py)
neither counts nor deletes the steps the other job committed (a manifest's `run_id`):

- a step newer than the one just committed (this job is behind): always;
- an older one (this job is ahead, review of walk-through 31 #3: its pruning deleted the
  other job's newest steps as its own) while the other job writes the dir now: the dir's
  owner mark names another job (one launched into it after this job did), or the step was
  committed after this job's own launch (the mark's `at`).

A job that continues from another's checkpoints (that job ended before this one launched
into its dir) prunes them as its own, as before. Without a mark (a script saving without the
launcher, a job dir's own checkpoints/ that no other job was pointed at) nothing older is
left alone.
"""

from __future__ import annotations

import json
from typing import Any

from trainguard.checkpoint.manifest import MANIFEST, OWNER_NAME, Manifest, step_dir
from trainguard.checkpoint.storage import Storage

_UNREAD = object()


def other_writer(manifest: Manifest, run_id: str) -> str | None:
    """The job that committed `manifest` when it is not the job `run_id` (both known)."""
    theirs = manifest.extra.get("run_id")
    if not run_id or not isinstance(theirs, str) or not theirs or theirs == run_id:
        return None
    return theirs


class Sharers:
    """One prune's view of the other jobs' steps; `kept`: the newest one left alone."""

    def __init__(self, st: Storage, run_id: str, committed: int | None) -> None:
        self._st, self._run_id, self._committed = st, run_id, committed
        self._mark: Any = _UNREAD  # the dir's owner mark, read once when first needed
        self.kept: tuple[int, str] | None = None  # (step, its job)

    def leaves(self, step: int, manifest: Manifest | None) -> bool:
        """True when `step` (its manifest) is another job's that this prune leaves alone."""
        if manifest is None or self._committed is None:
            return False
        theirs = other_writer(manifest, self._run_id)
        if theirs is None or (step <= self._committed and not self._writes_now(manifest)):
            return False
        if self.kept is None or step > self.kept[0]:
            self.kept = (step, theirs)
        return True

    def manifest(self, step: int) -> Manifest | None:
        """A step's manifest, None when missing or unreadable (then pruned as before)."""
        try:
            return Manifest.from_json(self._st.read_bytes(f"{step_dir(step)}/{MANIFEST}"))
        except (OSError, ValueError):
            return None

    def _writes_now(self, manifest: Manifest) -> bool:
        mark = self._owner_mark()
        if mark is None:
            return False
        if mark.get("run_id") != self._run_id:
            return True  # another job launched into this dir after this one did
        at = mark.get("at")
        return isinstance(at, (int, float)) and manifest.created_at >= at

    def _owner_mark(self) -> dict[str, Any] | None:
        if self._mark is _UNREAD:
            try:
                mark = json.loads(self._st.read_bytes(OWNER_NAME))
            except (OSError, ValueError):
                mark = None
            self._mark = mark if isinstance(mark, dict) else None
        return self._mark  # type: ignore[no-any-return]
