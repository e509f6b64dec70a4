"""The job's goodput for the dashboard: trainguard.goodput's ledger as a dict (wall,
productive and badput seconds by cause, the segments of the wall time, step times), or why
there is none.

Computing it reads every checkpoint event and progress sample of the job (over a second for
100k events), so each result is kept: an ended job's until its store changes (new events,
another state), a running job's for RUNNING_TTL_S at most (it changes with the clock).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Hashable
from pathlib import Path
from typing import Any

from trainguard.controller.store import JobStore
from trainguard.errors import StoreError
from trainguard.goodput import job_goodput

log = logging.getLogger(__name__)
RUNNING_TTL_S = 5.0


def goodput_of(store: JobStore) -> dict[str, Any]:
    """`Goodput.to_dict()` of the job as of now, or {"goodput": None, "error": why}."""
    try:
        return job_goodput(store).to_dict()
    except StoreError as e:
        return {"goodput": None, "error": str(e)}
    except Exception as e:  # a ledger bug must not take the job view down with it
        log.exception("goodput of %s", store.job_dir)
        return {"goodput": None, "error": f"the goodput could not be computed ({e})"}


class GoodputCache:
    """goodput_of, once per job state (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: dict[Path, tuple[Hashable, float, dict[str, Any]]] = {}

    def get(self, job_dir: Path, store: JobStore, state: Hashable, ended: bool) -> dict[str, Any]:
        """The goodput of the job in `store`; `state` says what it was computed from (the
        newest event id, the job's state...): another state computes it again."""
        now = time.monotonic()
        with self._lock:
            hit = self._kept.get(job_dir)
        if hit is not None and hit[0] == state and (ended or now - hit[1] < RUNNING_TTL_S):
            return hit[2]
        doc = goodput_of(store)
        with self._lock:
            self._kept[job_dir] = (state, now, doc)
        return doc
