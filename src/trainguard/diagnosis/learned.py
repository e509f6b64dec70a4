"""The learned fallback: a naive Bayes model over the normalised words of a log's candidate
lines, shipped as data (model.json). Pure: deterministic, no numpy, no sklearn.

It is trained by scripts/train_diagnosis_model.py on the labelled corpus (tests/data/
diagnosis, every set but the blind one being built) and consulted only when the rules are
silent or weak (diagnosis/fallback.py). It explains itself: the line whose words weigh most
for the category it picked is reported as the evidence.

Words: a line is split at CamelCase and anything not a letter or digit, lower-cased; hex
and long numbers are dropped (addresses, steps, pids); adjacent word pairs are features too
("out memory", "already use"). The model scores a case as a bag of the distinct features of
its candidate lines (multinomial naive Bayes, Laplace smoothing).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from itertools import pairwise
from typing import Any

_CAMEL = re.compile(r"(?<=[a-z])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_SPLIT = re.compile(r"[^a-z0-9]+")
_HEXISH = re.compile(r"^(?:0x[0-9a-f]+|[0-9a-f]{8,}|\d{4,})$")
_STOP = frozenset(("the", "a", "an", "of", "to", "in", "on", "at", "is", "and", "or", "for",
                   "by", "be", "it", "this", "that", "with", "as", "from", "was", "are"))
MAX_TOKENS = 60  # features of one line


def tokens(text: str) -> list[str]:
    """The normalised words of one line, then its adjacent word pairs."""
    words = []
    for w in _SPLIT.split(_CAMEL.sub(" ", text[:400]).lower()):
        if len(w) < 2 or len(w) > 30 or w in _STOP or _HEXISH.match(w):
            continue
        words.append(w)
    pairs = [f"{a} {b}" for a, b in pairwise(words)]
    return (words + pairs)[:MAX_TOKENS]


@dataclass(frozen=True)
class Model:
    classes: tuple[str, ...]
    prior: tuple[float, ...]  # log P(class)
    weights: dict[str, tuple[float, ...]]  # feature -> log P(feature | class)

    def scores(self, feats: Iterable[str]) -> list[float]:
        s = list(self.prior)
        for t in feats:
            w = self.weights.get(t)
            if w is not None:
                for i, x in enumerate(w):
                    s[i] += x
        return s

    def weight(self, feat: str, k: int) -> float:
        """How much `feat` speaks for class `k` against the average class."""
        w = self.weights.get(feat)
        return 0.0 if w is None else w[k] - sum(w) / len(w)


@dataclass(frozen=True)
class Prediction:
    category: str
    probability: float  # the model's posterior (naive Bayes: overconfident)
    line: int  # index of the line that drove it in the lines given; -1: none
    features: tuple[str, ...]  # that line's features that weigh most for the category


def predict(model: Model, lines: Sequence[str]) -> Prediction | None:
    """The category the lines speak for, and the line that speaks most for it."""
    per_line = [tokens(t) for t in lines]
    feats = {t for ts in per_line for t in ts if t in model.weights}
    if not feats:
        return None
    s = model.scores(feats)
    k = max(range(len(s)), key=lambda i: (s[i], -i))
    top = max(s)
    prob = 1.0 / sum(math.exp(x - top) for x in s)
    best, best_w = -1, 0.0
    for i, ts in enumerate(per_line):
        w = sum(model.weight(t, k) for t in set(ts))
        if w > 0 and (w >= best_w or best < 0):
            best, best_w = i, w  # ties: the later line (closer to the end)
    drove: tuple[str, ...] = ()
    if best >= 0:
        drove = tuple(sorted(set(per_line[best]), key=lambda t: -model.weight(t, k))[:4])
    return Prediction(model.classes[k], prob, best, drove)


def model_from_dict(d: dict[str, Any]) -> Model:
    classes = tuple(d["classes"])
    return Model(classes, tuple(d["prior"]),
                 {t: tuple(w) for t, w in d["weights"].items() if len(w) == len(classes)})


@cache
def load_model() -> Model | None:
    """The shipped model; None when the package has none."""
    try:
        text = resources.files("trainguard.diagnosis").joinpath("model.json").read_text("utf-8")
    except (FileNotFoundError, OSError):
        return None
    return model_from_dict(json.loads(text))
