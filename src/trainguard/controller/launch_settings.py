"""A launch's settings: the effective ones its JobCreated/JobRelaunched event records, the
line that says what it runs, and what a relaunch changed from the previous launch's (the
SettingsChanged event). Pure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainguard.paths import JobPaths
from trainguard.records import plural
from trainguard.spec import JobSpec, flag_name

# settings that differ between launches of one job without anyone changing them: a Slurm
# requeue lands on other nodes and ports; the job dir may have been moved (its log and
# checkpoint dirs are compared inside it); the script as typed depends on the directory the
# command ran in (`entrypoint_path`, the file it named, is compared instead)
_PER_LAUNCH = frozenset({"run_id", "master_addr", "master_port", "controller_host",
                         "node_rank", "job_dir", "entrypoint"})
_IN_JOB_DIR = ("log_dir", "checkpoint_dir")
# recorded settings no flag sets, by the words that name them
_NO_FLAG = {"entrypoint_path": "the script"}


def settings_changes(before: dict[str, Any] | None,
                     after: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """The settings that differ, by key (in the order of `after`), as (before, after);
    nothing when none were recorded."""
    if before is None:
        return {}
    out = {}
    for k, v in after.items():
        if k in _PER_LAUNCH or k not in before:
            continue
        was = before[k]
        if k in _IN_JOB_DIR:
            was, v = _inside(was, before.get("job_dir")), _inside(v, after.get("job_dir"))
        if was != v:
            out[k] = (before[k], after[k])
    return out


def resume_caveat(changes: dict[str, tuple[Any, Any]], before: dict[str, Any],
                  after: dict[str, Any]) -> str:
    """What a checkpoint's resume into the changed settings cannot keep: with another world
    size the data position it saved (the batches consumed, a sampler's place) is read for
    the new one, and the resume is not exact; other script arguments may move it too (a
    batch size). Walk-through 39 #4: nothing said so; review 47 #8: 2x4 -> 4x2 is the same
    world. '' otherwise."""
    def world(s: dict[str, Any]) -> Any:
        return (s.get("nnodes") or 1) * (s.get("nproc_per_node") or 1)

    out = ""
    if world(before) != world(after):
        out += (f"; with the world size changed ({world(before)} -> {world(after)} ranks), the "
                "data position a checkpoint saved (the batches consumed, a sampler's place) is "
                "read for the new one: the resume is not exact")
    if "args" in changes:
        out += ("; with the script's arguments changed, the resume is not exact if one of "
                "them moves the data (a batch size, a seed)")
    return out


def changes_text(changes: dict[str, tuple[Any, Any]]) -> str:
    """`--nproc-per-node 2 -> 1, standby workers on -> off`: a flag's name for a value, the
    setting's words for a switch (its flag may be the `--no-` one)."""
    return ", ".join(f"{k.replace('_', ' ')} {_on(a)} -> {_on(b)}"
                     if isinstance(a, bool) or isinstance(b, bool)
                     else f"{_NO_FLAG.get(k) or flag_name(k)} {_shown(a)} -> {_shown(b)}"
                     for k, (a, b) in changes.items())


def _inside(path: Any, job_dir: Any) -> Any:
    """A dir inside the job dir as its place in it, so a moved job dir changes nothing."""
    if isinstance(path, str) and isinstance(job_dir, str):
        try:
            return "JOB_DIR/" + str(Path(path).relative_to(job_dir))
        except ValueError:
            pass
    return path


def _on(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return _shown(value)


def _shown(value: Any) -> str:
    return "none" if value is None else str(value)


def effective_settings(spec: JobSpec, paths: JobPaths) -> dict[str, Any]:
    """The effective settings, as `run --dry-run` prints them: the dirs the job uses,
    absolute (the spec holds them as given, or null for the defaults)."""
    doc = spec.model_dump(mode="json")
    doc.update(job_dir=str(paths.job_dir), log_dir=str(paths.log_dir),
               checkpoint_dir=str(paths.checkpoint_dir))
    if not (spec.module or spec.no_python):  # as given, and the file it named
        doc["entrypoint_path"] = str(Path(spec.entrypoint).resolve())
    return doc


def launch_summary(spec: JobSpec, paths: JobPaths) -> str:
    """What a launch runs, for its JobCreated/JobRelaunched event."""
    nodes = f" on {spec.nnodes} nodes" if spec.nnodes > 1 else ""
    what = (f"{spec.nnodes * spec.nproc_per_node} worker(s){nodes}, "
            f"max {plural(spec.max_restarts, 'restart')}, job dir {paths.job_dir}")
    if spec.operator_reexecution:
        what += "; operator re-execution on (scripts that run their steps in a StepGuard)"
    if spec.auto_resume:
        framework = {"hf": "transformers' Trainer", "lightning": "Lightning's Trainer"}
        what += (f"; auto-resume {spec.auto_resume} on (takes effect when the script "
                 f"imports {framework[spec.auto_resume]})")
    return what
