"""Failure families (families.yaml): what marks a category whatever the wording. Pure.

`best_line` scores candidate lines against every family signature and returns the best
supported category with the line that supports it; diagnosis/fallback.py consults it when
no rule decides. A signature is a few regexes that must all match one line (memory words and
an allocation verb; a bind verb, a failure word and a port), so a family needs a structure,
not a single word.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources

import yaml

from trainguard.diagnosis.taxonomy import Category, FaultDomain, RestartHelps

SECOND_BONUS = 0.5  # each further signature of the same category on the line
ERROR_BONUS = 0.4  # the line is an error line the scanner picked (not mere context)


@dataclass(frozen=True)
class Signature:
    category: Category
    regexes: tuple[re.Pattern[str], ...]
    weight: float


@dataclass(frozen=True)
class Families:
    signatures: tuple[Signature, ...]
    defaults: dict[Category, tuple[FaultDomain, RestartHelps]]

    def scores(self, text: str) -> dict[Category, float]:
        """Each category's support from one line (only those with any)."""
        hits: dict[Category, list[float]] = {}
        for s in self.signatures:
            if all(r.search(text) for r in s.regexes):
                hits.setdefault(s.category, []).append(s.weight)
        return {c: max(w) + SECOND_BONUS * (len(w) - 1) for c, w in hits.items()}


    def words(self, text: str, category: Category) -> str:
        """The words of `text` that the category's best matching signature matched."""
        best: tuple[float, str] = (0.0, "")
        for s in self.signatures:
            if s.category != category:
                continue
            found = [r.search(text) for r in s.regexes]
            if all(found) and s.weight > best[0]:
                best = (s.weight, " + ".join(repr(m.group(0).strip()) for m in found if m))
        return best[1]


@dataclass(frozen=True)
class Support:
    category: Category
    score: float
    index: int  # of the line, in the lines given


def parse_families(text: str) -> Families:
    # ASCII word classes: `\b` and `\w` take a CJK character for no letter, so a word glued
    # to Chinese prose is still a word (`loss训练一会后变成nan`: round 37)
    data = yaml.safe_load(text)
    sigs = tuple(Signature(Category(f["category"]),
                           tuple(re.compile(p, re.IGNORECASE | re.ASCII) for p in f["all"]),
                           float(f["weight"]))
                 for f in data["families"])
    defaults = {Category(k): (FaultDomain(v[0]), RestartHelps(v[1]))
                for k, v in data["defaults"].items()}
    return Families(sigs, defaults)


@cache
def load_families() -> Families:
    text = resources.files("trainguard.diagnosis").joinpath("families.yaml").read_text("utf-8")
    return parse_families(text)


def best_line(fam: Families, lines: Sequence[tuple[str, bool]],
              exclude: frozenset[Category] = frozenset()) -> Support | None:
    """The best supported (category, line) among `lines` ((text, is an error line)); ties go
    to the later line (closer to where the process stopped)."""
    best: Support | None = None
    for i, (text, error) in enumerate(lines):
        for cat, score in fam.scores(text).items():
            if cat in exclude:
                continue
            score += ERROR_BONUS if error else 0.0
            if best is None or score >= best.score:
                best = Support(cat, score, i)
    return best
