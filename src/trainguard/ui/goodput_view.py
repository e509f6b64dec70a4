"""The job's goodput for the dashboard: trainguard.goodput's ledger as a dict (wall,
productive and badput seconds by cause, the segments of the wall time, step times), or why
there is none."""

from __future__ import annotations

import logging
from typing import Any

from trainguard.controller.store import JobStore
from trainguard.errors import StoreError
from trainguard.goodput import job_goodput

log = logging.getLogger(__name__)


def goodput_of(store: JobStore) -> dict[str, Any]:
    """`Goodput.to_dict()` of the job as of now, or {"goodput": None, "error": why}."""
    try:
        return job_goodput(store).to_dict()
    except StoreError as e:
        return {"goodput": None, "error": str(e)}
    except Exception as e:  # a ledger bug must not take the job view down with it
        log.exception("goodput of %s", store.job_dir)
        return {"goodput": None, "error": f"the goodput could not be computed ({e})"}
