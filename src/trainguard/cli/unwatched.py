"""What a multi-node job trained while no controller watched, recorded by `trainguard stop`.

A killed launcher's node agents train on (waiting for a controller to take the job over)
and commit checkpoints that no store records: a takeover or a relaunch records them from
what the agents kept, but `trainguard stop` ends the agents, and with them what they kept.
So `stop` of a `lost` job reads the newest valid checkpoint of this job in its checkpoint
dir and, when it is further than the store's last progress, records it as the
`CheckpointSaved` it was (its commit time, its attempt), so that `status`, `ls` and
`metrics` show it as goodput.md says (walk-through 36 #9: step 64 was shown, 130 committed).
Each manifest is read as a resume reads it (loading.read_retried: a transient storage error
is tried again, a lasting one costs about 7.5 s more and ends in the same note; review 41 #5).
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from trainguard.checkpoint.errors import CheckpointError
from trainguard.checkpoint.sharing import other_writer
from trainguard.cli.fmt import complain
from trainguard.controller.shown import last_progress
from trainguard.controller.store import JobStore
from trainguard.controller.store_rows import checkpoint_dir_of
from trainguard.errors import TrainguardError
from trainguard.launch_checks import job_lock
from trainguard.records import Event, Involved, Level, Reason


def further(found: int | None, recorded: Any) -> bool:
    """Whether the newest checkpoint found is past the store's last progress."""
    return found is not None and (not isinstance(recorded, int) or found > recorded)


def newest_own(location: str, run_id: str) -> tuple[int, float] | None:
    """(step, commit time) of the newest valid checkpoint `run_id` committed at `location`
    (manifest and file sizes right, as `ckpt ls` judges; another job's steps skipped)."""
    from trainguard.checkpoint.storage import Storage

    st = Storage(location, {})
    steps = st.steps()  # newest first
    if not steps:
        return None
    from trainguard.checkpoint.loading import newest_valid  # torch: only when there are some

    found = newest_valid(st, steps, accept=lambda m: other_writer(m, run_id) is None)
    return None if found is None else (found[0], found[1].created_at)


def record_unwatched(job_dir: Path) -> str | None:
    """Record the newest checkpoint a controller-less stretch committed; what to print
    (None: nothing further than the store's). A checkpoint dir that cannot be read is a
    note, never the stop's failure."""
    with JobStore.open(job_dir) as store:
        meta = store.meta()
        recorded = last_progress(meta, store.last_checkpoint())["step"]
    run_id, location = str(meta.get("run_id") or ""), checkpoint_dir_of(meta, job_dir)
    try:
        found = newest_own(location, run_id)
    except (OSError, ValueError, CheckpointError, TrainguardError) as e:
        complain("stop", f"its checkpoints at {location} could not be read ({e}): the "
                 "steps trained while no controller watched are not recorded", "note")
        return None
    if found is None or not further(found[0], recorded):
        return None
    step, created = found
    at = datetime.fromtimestamp(created, timezone.utc)
    attempt = meta.get("attempt") if isinstance(meta.get("attempt"), int) else None
    try:
        with job_lock(job_dir), JobStore.create(job_dir, run_id) as store:
            store.add_event(Event(at, Level.INFO, Reason.CHECKPOINT_SAVED.value, (
                f"checkpoint of step {step} committed at {location} while no controller "
                "watched (found by `trainguard stop`)"), Involved(run_id, attempt=attempt),
                data={"step": step, "location": location, "sent_at": round(created, 3)}))
    except (OSError, TrainguardError) as e:
        complain("stop", f"the checkpoint of step {step} could not be recorded ({e})", "note")
        return None
    return (f"recorded its checkpoint of step {step}, committed at "
            f"{at.astimezone().strftime('%H:%M:%S')} while no controller watched (the last "
            f"step recorded was {recorded if recorded is not None else '-'})")
