"""Two jobs in one checkpoint dir: which of the other job's steps a save leaves alone.

Two jobs should never write one dir (the launch refuses a dir another running job writes,
where it can tell: docs/checkpoints.md). Where they do anyway (the other job's launcher on
another machine, an object store with no lock), each save's prune (checkpoint/saving.py)
sorts every step another job committed (a manifest's `run_id`) as:

- LEAVE (neither counted nor deleted): a step newer than the one just committed (this job
  is behind); an older one while the other job writes the dir now: the dir's owner mark
  names another job (one launched into it after this job did), or the step was committed
  after this job's own launch (the mark's `at`; review of walk-through 31 #3); and the
  other job's newest step, always (review of walk-through 33 #4: a job still running lost
  its only checkpoint to the job that launched last);
- DROP (deleted, never counted toward this job's `keep`): the other job's older steps, from
  before this job launched (a job that continues from another's checkpoints: their newest
  stays).

A step without a manifest (a save in flight, or a killed one's leftover) and a staging dir
are left alone while the owner mark names another job (#3: the job ahead deleted the other
job's save in flight); else they are this job's leftovers, as before. Without a mark (a
script saving without the launcher, a job dir's own checkpoints/ that no other job was
pointed at) nothing older is left alone but the other jobs' newest steps.
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


OWN, LEAVE, DROP = "own", "leave", "drop"


class Sharers:
    """One prune's view of the other jobs' steps; `kept`: the newest step of a job that
    writes the dir too (newer, or saved since this job launched): the job says it."""

    def __init__(self, st: Storage, run_id: str, committed: int | None) -> None:
        self._st, self._run_id, self._committed = st, run_id, committed
        self._mark: Any = _UNREAD  # the dir's owner mark, read once when first needed
        self._newest_seen: set[str] = set()  # the other jobs whose newest step was met
        self.kept: tuple[int, str] | None = None  # (step, its job)

    def sort(self, step: int, manifest: Manifest | None) -> str:
        """OWN, LEAVE or DROP for `step` (its manifest, None when it has none); call for the
        steps newest first."""
        if self._committed is None or not self._run_id:
            return OWN
        if manifest is None:
            return LEAVE if self.other_launched() else OWN
        theirs = other_writer(manifest, self._run_id)
        if theirs is None:
            return OWN
        newest = theirs not in self._newest_seen
        self._newest_seen.add(theirs)
        if step > self._committed or self._writes_now(manifest):
            if self.kept is None or step > self.kept[0]:
                self.kept = (step, theirs)
            return LEAVE
        return LEAVE if newest else DROP

    def manifest(self, step: int) -> Manifest | None:
        """A step's manifest, None when missing or unreadable."""
        try:
            return Manifest.from_json(self._st.read_bytes(f"{step_dir(step)}/{MANIFEST}"))
        except (OSError, ValueError):
            return None

    def other_launched(self) -> bool:
        """Whether the dir's owner mark names another job: it launched here after this one."""
        mark = self._owner_mark()
        return bool(self._run_id) and mark is not None and mark.get("run_id") != self._run_id

    def _writes_now(self, manifest: Manifest) -> bool:
        if self.other_launched():
            return True
        mark = self._owner_mark()
        at = None if mark is None else mark.get("at")
        return isinstance(at, (int, float)) and manifest.created_at >= at

    def _owner_mark(self) -> dict[str, Any] | None:
        if self._mark is _UNREAD:
            try:
                mark = json.loads(self._st.read_bytes(OWNER_NAME))
            except (OSError, ValueError):
                mark = None
            self._mark = mark if isinstance(mark, dict) else None
        return self._mark  # type: ignore[no-any-return]
