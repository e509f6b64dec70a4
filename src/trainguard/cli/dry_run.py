"""`trainguard run --dry-run`: the effective settings as `run` would use them, and where each
came from."""

from __future__ import annotations

from typing import Any

from trainguard.paths import DEFAULT_RUNS_DIR
from trainguard.spec import JobSpec
from trainguard.spec_build import DEFAULT

# what a dir no layer gave derives from (paths.JobPaths.for_spec)
_DERIVED = {"job_dir": f"the default ({DEFAULT_RUNS_DIR}/<run id>)",
            "log_dir": "the job dir (JOB_DIR/logs)",
            "checkpoint_dir": "the job dir (JOB_DIR/checkpoints)"}


def dry_run_doc(spec: JobSpec, origin: dict[str, str]) -> dict[str, Any]:
    """The effective settings as `run` would use them: the job dir (and log and checkpoint
    dirs) it would use, and the run id: given, the stored one of a job dir that holds a job
    (a relaunch continues it), or `null` when a new one is assigned at launch. What `run`
    refuses before it starts (a dir that cannot be made, another job's run id), this refuses
    too: both check with launch_checks.prepare. `from` names, for every key, the layer that gave
    its value (`the default`, `the llm preset`, `the job file job.yaml`, `the command line`),
    or what it was derived from."""
    from trainguard.launch_checks import prepare

    drawn = spec.run_id
    new_id = "run_id" not in spec.model_fields_set
    spec, paths = prepare(spec, create=False)
    stored_id = new_id and spec.run_id != drawn
    new_id = new_id and not stored_id
    doc = spec.model_dump(mode="json")
    doc.update(job_dir=str(paths.job_dir), log_dir=str(paths.log_dir),
               checkpoint_dir=paths.checkpoint_dir)
    where = {key: origin.get(key, _DERIVED.get(key, DEFAULT)) for key in doc}
    if stored_id:
        where["run_id"] = "the job the job dir holds (a relaunch continues it)"
    if new_id:
        doc["run_id"] = None
        doc["run_id_note"] = "assigned at launch (tg- and 8 hex digits)"
        where["run_id"] = "assigned at launch"
        for key in ("job_dir", "log_dir", "checkpoint_dir"):
            doc[key] = doc[key].replace(spec.run_id, "<run id>")
    doc["from"] = where
    return doc
