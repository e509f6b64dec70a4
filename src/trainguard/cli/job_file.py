"""Reading the YAML job file (`run --config`): one mapping, read strictly (a key given twice
is refused, not silently the last). cli/run spells its values as the flags are."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from trainguard.errors import SpecError


class _DuplicateKey(Exception):
    def __init__(self, key: str, first: int, again: int) -> None:
        super().__init__(key)
        self.key, self.first, self.again = key, first, again


class _Loader(yaml.SafeLoader):
    """safe_load's loader, refusing a mapping that gives one key twice (a flag's spelling,
    `max-restarts`, is the key `max_restarts`)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, str):
                key = key.replace("-", "_")
            if isinstance(key, str | int | float | bool):  # hashable: a plain key
                if key in seen:
                    raise _DuplicateKey(str(key), seen[key], line)
                seen[key] = line
        return super().construct_mapping(node, deep)


def load_job_file(path: Path) -> dict[str, Any]:
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), _Loader)  # a SafeLoader
    except _DuplicateKey as e:
        raise SpecError(f"job file {path}: {e.key}", f"given twice (lines {e.first} and "
                        f"{e.again})", "keep one: YAML would silently take the last") from None
    except OSError as e:
        raise SpecError("--config", f"cannot read {path} ({e.strerror})",
                        "check the path") from None
    except yaml.YAMLError as e:
        raise SpecError("--config", f"{path} is not valid YAML: {_yaml_problem(e)}",
                        "fix the syntax there") from None
    except UnicodeDecodeError as e:
        raise SpecError("--config", f"{path} is not UTF-8 text ({e.reason} at byte {e.start})",
                        "save it as UTF-8") from None
    except RecursionError:
        raise SpecError("--config", f"{path} is nested too deeply to read",
                        "a job file is one mapping of keys to plain values") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SpecError("--config", f"{path} holds a {type(data).__name__}, not a mapping",
                        "write one key per line, e.g. `nproc_per_node: 2`")
    return {str(k).replace("-", "_"): val for k, val in data.items()}


def _yaml_problem(e: yaml.YAMLError) -> str:
    """One line: what the parser found and where (line and column, from 1)."""
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    context = getattr(e, "context", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{problem}{where}" + (f" ({context})" if context else "")
