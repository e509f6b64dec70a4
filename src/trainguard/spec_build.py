"""Building a JobSpec from its layers, lowest first: built-in defaults < `--scenario` preset <
job file < flags, keeping where each value came from: an error names it (`--grace-period /
'grace_period_s' (from the llm preset)`), and so does `run --dry-run`.
Pure: the caller reads the job file.
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple, get_args, get_origin

from pydantic import ConfigDict, TypeAdapter, ValidationError

from trainguard.errors import SpecError
from trainguard.presets import PRESETS
from trainguard.spec import FIELDS, Conflict, JobSpec, flag_name
from trainguard.spec_words import plain
from trainguard.suggest import closest, instead, words

DEFAULT = "the default"  # the origin of a value no layer gave


class Built(NamedTuple):
    """A validated spec and where each value that is not a built-in default came from
    (`the llm preset`, `the job file job.yaml`, `the command line`)."""

    spec: JobSpec
    origin: dict[str, str]


def build_spec(
    job_file: dict[str, Any] | None, flags: dict[str, Any], source: str = "job file"
) -> JobSpec:
    """Merge preset < job file < flags and validate; errors name the key and the fix."""
    return build(job_file, flags, source).spec


def build(job_file: dict[str, Any] | None, flags: dict[str, Any], source: str = "job file"
          ) -> Built:
    """build_spec, keeping each value's origin (`run --dry-run` shows it)."""
    job_file = _job_file(dict(job_file or {}), source)
    scenario = flags.get("scenario", job_file.get("scenario"))
    merged: dict[str, Any] = {}
    origin: dict[str, str] = {}
    preset: dict[str, Any] = {}
    if scenario is not None:
        if scenario not in PRESETS:
            raise SpecError("scenario", f"unknown scenario {scenario!r}",
                            f"use one of {', '.join(PRESETS)}")
        preset = PRESETS[scenario]
        merged.update(preset)
        origin.update(dict.fromkeys(preset, f"the {scenario} preset"))
    merged.update(job_file)
    origin.update(dict.fromkeys(job_file, f"the {source}"))
    merged.update(flags)
    origin.update(dict.fromkeys(flags, "the command line"))
    _preset_yields(merged, origin, set(preset) - set(job_file) - set(flags))
    try:
        return Built(JobSpec(**merged), origin)
    except ValidationError as e:
        raise _spec_error(e, source, origin) from None


def _preset_yields(merged: dict[str, Any], origin: dict[str, str], from_preset: set[str]
                   ) -> None:
    """A preset's restart_on_hang / unconditional_restart (`from_preset`: the keys only the
    preset set) gives way to a job file's or flag's hang_detection false / max_restarts 0
    (`--scenario llm --no-hang-detection`), where the same settings given by hand conflict
    (JobSpec._consistent)."""
    for key, by, off in (("restart_on_hang", "hang_detection", False),
                         ("unconditional_restart", "max_restarts", 0)):
        if merged.get(by) == off and key in from_preset and merged[key]:
            merged[key] = False
            origin[key] = f"{origin[key]}, turned off by {by} from {origin.get(by, DEFAULT)}"


def _job_file(job_file: dict[str, Any], source: str) -> dict[str, Any]:
    """The job file's values, checked key by key; every bad key is said at once (walk-through
    25: a file with two mistakes told of one, then, once fixed, of the next)."""
    values, errors = {}, []
    for key, value in job_file.items():
        try:
            _check_key(key, source)
            values[key] = _job_file_value(key, value, source)
        except SpecError as e:
            errors.append(e)
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise SpecError(source, f"{len(errors)} problems: " + "; ".join(
            f"{e.key.removeprefix(f'{source}: ')}: {e.problem} ({e.fix})" for e in errors),
            "fix each one (`trainguard run --dry-run ...` checks the file again)")
    return values


# `trainguard run`'s flags that say how to run the command, not what the job is: no job-file
# key (walk-through 33 #7: `dry_run: true` was told "did you mean 'run_id'?")
COMMAND_LINE_ONLY = {"dry-run": "--dry-run", "config": "--config", "verbose": "--verbose"}


def _check_key(key: str, source: str) -> None:
    if key not in FIELDS:  # matched on the key's words and its flag's
        close = closest(str(key), {k: [flag_name(k)] for k in FIELDS})
        flag = COMMAND_LINE_ONLY.get("-".join(words(str(key))))
        fix = (f"`{key}` is not a job-file setting: pass {flag} on the command line"
               if flag else instead(str(key))
               or (f"did you mean '{close}' ({flag_name(close)})?" if close
                   else f"valid keys: {', '.join(FIELDS)}"))
        raise SpecError(f"{source}: {key}", "unknown key", fix)


_KINDS = ((bool, "true or false", "true"), (int, "a whole number", "3"),
          (float, "a number", "2.5"), (str, "a string", "'...'"))


def _job_file_value(key: str, value: Any, source: str) -> Any:
    """A job-file value as strict as the flag: `max_restarts: yes` is not 1, `precheck: "no"`
    is not false. Numbers in `args` become strings (`args: [--steps, 200]`)."""
    if key == "args" and isinstance(value, list):
        value = [str(a) if isinstance(a, int | float) and not isinstance(a, bool) else a
                 for a in value]
    annotation: Any = JobSpec.model_fields[key].annotation
    try:
        return TypeAdapter(annotation, config=ConfigDict(strict=True)).validate_python(value)
    except ValidationError:
        pass
    got = f"{value!r} ({type(value).__name__})"
    note = "; YAML reads yes/no/on/off as true/false" if isinstance(value, bool) else ""
    inner = [a for a in get_args(annotation) if a is not type(None)]
    if type(None) in get_args(annotation) and len(inner) == 1:
        annotation = inner[0]  # X | None
    if get_origin(annotation) is list:
        ints = int in get_args(annotation)
        want = "a list of whole numbers" if ints else "a list of strings"
        fix = f"write {want}, e.g. `{key}: {'[0, 1]' if ints else '[a, b]'}`"
    elif get_origin(annotation) is dict:
        want = "a mapping of whole numbers"
        fix = f"write {want}, e.g. `{key}: {{0: 1}}`"
    elif get_origin(annotation) is Literal:
        want = "one of " + ", ".join(map(str, get_args(annotation)))
        fix = f"write {want}"
    else:
        kinds = [k for k in _KINDS if k[0] in (annotation, *get_args(annotation))]
        want = " or ".join(k[1] for k in kinds) if kinds else str(annotation)
        fix = f"write {want}, e.g. `{key}: {kinds[0][2]}`" if kinds else f"write {want}"
    raise SpecError(f"{source}: {key}", f"{got} is not {want}{note}", fix)


def _spec_error(e: ValidationError, source: str, origin: dict[str, str]) -> SpecError:
    err = e.errors()[0]
    conflict = (err.get("ctx") or {}).get("error")
    if isinstance(conflict, Conflict):
        names = " and ".join(_named(k, origin) for k in conflict.keys)
        return SpecError(names, conflict.problem, conflict.fix)
    key = ".".join(str(p) for p in err["loc"])
    problem, want = plain(err)
    if err["type"] == "missing" and key == "entrypoint":
        return SpecError(key, "no training script given", "give the training script after "
                         "the flags (`trainguard run [flags] train.py`), or `entrypoint: "
                         "train.py` in the job file")
    if err["type"] == "missing":
        return SpecError(key, problem, f"set {flag_name(key)} / '{key}'")
    field = JobSpec.model_fields.get(key)
    hint = (field.description if field is not None and field.description
            else "see `trainguard run --help`")
    to = f" to {want}" if want else ""
    return SpecError(key, problem, f"set {flag_name(key)} / '{key}'{to} (this value came from "
                     f"{origin.get(key, 'the ' + source)}): {hint}")


def _named(key: str, origin: dict[str, str]) -> str:
    """`--restart-backoff-max / 'restart_backoff_max_s' (from the llm preset)`, or `(the
    default)`."""
    where = f"from {origin[key]}" if key in origin else DEFAULT
    return f"{flag_name(key)} / '{key}' ({where})"
