"""The failure signatures (rules.yaml), validated and compiled. Pure: parsing only.

`load_rules()` reads the packaged rules.yaml (importlib.resources); `parse_rules(text)`
validates any rules text, naming the rule and key of the first mistake. A pattern may name a
list of the file's `words:` as `{{name}}` (one message's translations, kept in one place).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from trainguard.diagnosis.taxonomy import Category, FaultDomain, RestartHelps, Role
from trainguard.errors import RulesError
from trainguard.spec_words import plain


class Example(BaseModel):
    model_config = ConfigDict(extra="forbid")
    line: str
    source: str = Field(pattern=r"^https?://")


class RuleSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str = Field(pattern=r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
    category: Category
    subcategory: str | None = None
    domain: FaultDomain
    restart: RestartHelps
    role: Literal["decisive", "cause", "weak", "symptom"] = "cause"
    isolate: bool = False
    pattern: str
    exception: bool = False
    fatal_only: bool = False
    advice: str
    examples: list[Example] = Field(default_factory=list)

    @field_validator("restart", mode="before")
    @classmethod
    def _quoted(cls, v: Any) -> Any:
        if isinstance(v, bool):
            raise ValueError('write restart as a quoted string: "yes", "no" or "maybe" '
                             "(YAML reads a bare yes/no as a boolean)")
        return v

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, v: str) -> str:
        try:
            re.compile(v)
        except re.error as e:
            raise ValueError(f"not a valid regular expression: {e}") from e
        return v


class RulesFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: Literal[1]
    words: dict[str, list[str]] = Field(default_factory=dict)
    rules: list[RuleSpec]


_WORD_REF = re.compile(r"\{\{(\w+)\}\}")


def _expand(pattern: str, words: dict[str, str], where: str) -> str:
    """`pattern` with each `{{name}}` replaced by the group of its words."""
    def one(m: re.Match[str]) -> str:
        if m.group(1) not in words:
            known = ", ".join(sorted(words)) or "none"
            raise RulesError(f"{where}: names words {m.group(1)!r} that `words:` does not "
                             f"define (defined: {known}). Fix: add them under `words:` or "
                             "correct the name")
        return words[m.group(1)]
    return _WORD_REF.sub(one, pattern)


@dataclass(frozen=True)
class Rule:
    id: str
    category: Category
    subcategory: str | None
    domain: FaultDomain
    restart: RestartHelps
    role: Role
    isolate: bool
    regex: re.Pattern[str]
    exception: bool
    fatal_only: bool
    advice: str
    examples: tuple[Example, ...]
    priority: int  # position in the file: lower wins on one line


@dataclass(frozen=True)
class RuleSet:
    rules: tuple[Rule, ...]
    words: dict[str, str]  # name -> `(?:one|of|them)`, as a pattern's {{name}} reads

    def match(self, text: str, *, is_exception: bool = False) -> Rule | None:
        """The first rule matching one line (exception-only rules need `is_exception`)."""
        for r in self.rules:
            if (is_exception or not r.exception) and r.regex.search(text):
                return r
        return None

    def by_id(self, rule_id: str) -> Rule:
        for r in self.rules:
            if r.id == rule_id:
                return r
        raise KeyError(rule_id)


def parse_rules(text: str, origin: str = "rules") -> RuleSet:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise RulesError(f"{origin}: not valid YAML: {e}") from e
    try:
        parsed = RulesFile.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        loc = first["loc"]
        where = ".".join(str(p) for p in loc)
        if len(loc) >= 2 and loc[0] == "rules" and isinstance(loc[1], int):
            items = data.get("rules") if isinstance(data, dict) else None
            rid = items[loc[1]].get("id") if isinstance(items, list) and isinstance(
                items[loc[1]], dict) else None
            where = f"rule {rid or loc[1]!r}, key {'.'.join(str(p) for p in loc[2:])}"
        problem, want = plain(first)
        fix = f"make it {want}" if want else (
            "add it" if first["type"] == "missing" else "remove or correct it")
        raise RulesError(f"{origin}: {where}: {problem}. Fix: {fix} (a rules file is YAML: "
                         "`version: 1` and `rules:`, a list of rules; docs/diagnosis.md, "
                         "\"Rules are data\")") from e
    ids = [r.id for r in parsed.rules]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise RulesError(f"{origin}: rule ids must be unique; repeated: {', '.join(dupes)}")
    words = {name: "(?:" + "|".join(alts) + ")" for name, alts in parsed.words.items()}
    rules = []
    for i, r in enumerate(parsed.rules):
        where = f"{origin}: rule {r.id!r}, key pattern"
        pattern = _expand(r.pattern, words, where)
        try:
            regex = re.compile(pattern)
        except re.error as e:
            raise RulesError(f"{where}: not a valid regular expression once its words are "
                             f"put in: {e}. Fix: correct the pattern or the words") from e
        rules.append(Rule(r.id, r.category, r.subcategory, r.domain, r.restart, Role(r.role),
                          r.isolate, regex, r.exception, r.fatal_only, r.advice.strip(),
                          tuple(r.examples), i))
    return RuleSet(tuple(rules), words)


@cache
def load_rules() -> RuleSet:
    """The rules shipped with trainguard."""
    text = resources.files("trainguard.diagnosis").joinpath("rules.yaml").read_text("utf-8")
    return parse_rules(text, "trainguard/diagnosis/rules.yaml")
