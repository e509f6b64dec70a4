"""The validation library's errors in trainguard's own words.

pydantic says `Input should be less than or equal to 128`; a user reads `200 is more than 128,
the most allowed`, and the fix says what to set it to (`128 or less`). `plain(err)` gives the
problem and the value to write for one error of `ValidationError.errors()`; an error type not
mapped here keeps pydantic's message.
"""

from __future__ import annotations

from typing import Any


def shown(value: Any) -> str:
    """A value as a user wrote it: `-1` (not `-1.0`), `'x'` for text."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, int):
        return str(value)
    return repr(value)


def plain(err: Any) -> tuple[str, str | None]:
    """(the problem, what to write instead or None) for one pydantic error dict."""
    kind, ctx, got = err["type"], err.get("ctx") or {}, err.get("input")
    v = shown(got)
    bounds = {
        "less_than_equal": ("le", "is more than {b}, the most allowed", "{b} or less"),
        "less_than": ("lt", "is too large: it must be less than {b}", "less than {b}"),
        "greater_than_equal": ("ge", "is less than {b}, the least allowed", "{b} or more"),
        "greater_than": ("gt", "is too small: it must be more than {b}", "more than {b}"),
    }
    if kind in bounds:
        name, problem, want = bounds[kind]
        b = shown(ctx.get(name))
        if kind == "greater_than_equal" and b == "0":
            problem = "is negative"
        return f"{v} {problem.format(b=b)}", want.format(b=b)
    if kind in ("int_parsing", "int_type", "int_from_float"):
        return f"{v} is not a whole number", "a whole number"
    if kind in ("float_parsing", "float_type"):
        return f"{v} is not a number", "a number"
    if kind in ("bool_parsing", "bool_type"):
        return f"{v} is not true or false", "true or false"
    if kind == "list_type":
        return f"{v} is not a list", "a list (`- item` lines in YAML)"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return f"{v} is not a mapping", "a mapping (`key: value` lines in YAML)"
    if kind == "string_type":
        return f"{v} is not text", "text"
    if kind == "literal_error":
        expected = str(ctx.get("expected", "")).replace("'", "")
        return f"{v} is not one of {expected}", f"one of {expected}"
    if kind == "missing":
        return "is required", None
    if kind == "extra_forbidden":
        return "is not a setting trainguard knows", None
    msg = str(err.get("msg", "")).removeprefix("Value error, ")
    return f"{msg} (got {v})", None
