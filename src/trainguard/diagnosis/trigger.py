"""The scanner's fast paths, in RE2 (linear time, in C). Pure.

- `prefilter`: one regex, the alternation of every rule's pattern plus tracebacks,
  exception lines and exit notices, run over raw byte chunks to find the few lines worth
  decoding;
- `rule_set`: the same patterns as an RE2 set, which names in one pass every rule that may
  match a hit line, so Python's `re` confirms one or two rules instead of trying all.

`Trigger.match` returns exactly what `RuleSet.match` returns (the first rule, in file order,
whose Python pattern matches); tests/unit/test_diagnosis_rules.py checks it on every example
and corpus line.
"""

from __future__ import annotations

from dataclasses import dataclass

import re2

from trainguard.diagnosis.rules import Rule, RuleSet
from trainguard.errors import RulesError

# what else makes a line worth a look: tracebacks, exception lines, exit notices
EXTRA = (
    r"Traceback \(most recent call last\)|[a-z0-9_](?:Error|Exception|Exit|Interrupt)\b"
    r"|exitcode\s*:\s*-?\d+|exitcode: -?\d+|terminated with (?:signal|exit code)"
    r"|task \d+: |exits with return code|During handling of the above exception|died with <Signals"
    r"|The above exception was the direct"
)
MAX_MEM = 256 << 20


@dataclass(frozen=True)
class Trigger:
    rules: RuleSet
    prefilter: object  # re2 pattern over bytes
    rule_set: object  # re2.Set over the rules' patterns (line text, UTF-8)
    exception_only: tuple[int, ...]  # positions of rules that match exception lines only

    def match(self, text: str, *, is_exception: bool = False) -> Rule | None:
        hits = self.rule_set.Match(text.encode("utf-8", "replace")) or ()  # type: ignore[attr-defined]
        order = sorted(hits) if not is_exception else sorted({*hits, *self.exception_only})
        for i in order:
            rule = self.rules.rules[i]
            if (is_exception or not rule.exception) and rule.regex.search(text):
                return rule
        return None


def compile_trigger(rules: RuleSet) -> Trigger:
    opts = re2.Options()
    opts.max_mem = MAX_MEM
    parts = [f"(?:{r.regex.pattern.lstrip('^')})" for r in rules.rules if not r.exception]
    parts.append(EXTRA)
    try:
        prefilter = re2.compile("|".join(parts).encode(), opts)
        rule_set = re2.Set.SearchSet(opts)
        for r in rules.rules:
            index = rule_set.Add(r.regex.pattern.encode())
            if index != r.priority:  # pragma: no cover - Add numbers patterns in order
                raise RulesError(f"rule {r.id!r}: RE2 set index {index} != {r.priority}")
        rule_set.Compile()
    except re2.error as e:
        raise RulesError(f"a rule pattern is not valid RE2 syntax (no look-arounds or "
                         f"back-references): {e}") from e
    return Trigger(rules, prefilter, rule_set,
                   tuple(r.priority for r in rules.rules if r.exception))
