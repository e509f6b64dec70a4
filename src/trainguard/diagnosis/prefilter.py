"""The scanner's fast paths, in RE2 (linear time, in C). Pure.

- `prefilter`: one regex, the alternation of every rule's pattern (unanchored) plus
  tracebacks, exception lines and exit notices, run over raw byte chunks to find the few
  lines worth decoding; no match spans a newline, so what a chunk's lines hit does not
  depend on where the chunk ends;
- `rule_set`: the same patterns as an RE2 set, which names in one pass every rule that may
  match a hit line, so Python's `re` confirms one or two rules instead of trying them all.

`Trigger.match` returns what `RuleSet.match` returns (the first rule, in file order, whose
Python pattern matches); tests/unit/test_diagnosis_rules.py checks that on every example
and corpus line. A rules file with a pattern RE2 cannot run (a look-around, a
back-reference) gets Python's slower `re` for both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import re2

from trainguard.diagnosis.rules import Rule, RuleSet
from trainguard.worker.contract import RECOVERY_PATTERN

# what else makes a line worth a look: tracebacks, exception lines, exit notices, recoveries
EXTRA = (
    r"Traceback \(most recent call last\)|\w(?:Error|Exception|Exit|Interrupt)\b"
    r"|exitcode\s*:\s*-?\d+|exitcode: -?\d+|terminated with (?:signal|exit code)"
    r"|task \d+: |exits with return code|status failed cmd \["
    r"|During handling of the above exception|died with <Signals"
    r"|The above exception was the direct|WTERMSIG \d+|exited on signal \d+"
    r"|line \d+:\s+\d+ (?:Killed|Segmentation fault|Bus error|Aborted|Terminated)"
    r"|zsh: (?:abort|killed|segmentation fault|bus error|terminated)\s"
    r"|\[\d{1,4}\] +[+-]? *\d{1,9} (?:abort|killed|segmentation fault|bus error|terminated) "
    r"|exit (?:code (?:-?\d{10}|0x[0-9A-Fa-f]{8})|status 0x[0-9A-Fa-f]{8})\b"
    # trainguard's line where a rank recovered in place (the trigger reads no group)
    "|" + RECOVERY_PATTERN
)
MAX_MEM = 256 << 20
# a regex's escapes, character classes and single characters; the anchors among them
_REGEX_TOKEN = re.compile(r"\\.|\[\^?\]?(?:\\.|[^\]\\])*\]|.", re.DOTALL)
_ANCHORS = ("^", "$", r"\A", r"\Z", r"\z")


@dataclass(frozen=True)
class Trigger:
    rules: RuleSet
    prefilter: Any  # re2 (or re) pattern over bytes
    rule_set: Any  # re2.Set over the rules' patterns, or None (then every rule is tried)
    exception_only: tuple[int, ...]  # positions of rules that match exception lines only

    def search(self, data: bytes, pos: int = 0) -> Any:
        return self.prefilter.search(data, pos)

    def finditer(self, data: bytes) -> Any:
        return self.prefilter.finditer(data)

    def match(self, text: str, *, is_exception: bool = False) -> Rule | None:
        """The first rule, in file order, that matches the line."""
        if self.rule_set is None:
            return self.rules.match(text, is_exception=is_exception)
        found = self.rule_set.Match(text.encode("utf-8", "replace"))
        hits: set[int] = {int(i) for i in found or ()}
        if is_exception:
            hits.update(self.exception_only)
        for i in sorted(hits):
            rule = self.rules.rules[i]
            if (is_exception or not rule.exception) and rule.regex.search(text):
                return rule
        return None


def unanchor(pattern: str) -> str:
    """The pattern without its anchors (^ $ \\A \\Z outside character classes): the rules
    match a line stripped of its prefixes, the prefilter runs over raw chunks, so it must
    find `Killed` in `[rank3]: Killed` for a rule `^Killed$`."""
    return "".join(t for t in _REGEX_TOKEN.findall(pattern) if t not in _ANCHORS)


def prefilter_source(rules: RuleSet) -> str:
    """The prefilter regex: every rule's pattern, unanchored, and EXTRA."""
    parts = [f"(?:{unanchor(r.regex.pattern)})" for r in rules.rules if not r.exception]
    return "|".join([*parts, EXTRA])


def compile_trigger(rules: RuleSet) -> Trigger:
    pattern = prefilter_source(rules).encode()
    exception_only = tuple(r.priority for r in rules.rules if r.exception)
    opts = re2.Options()
    opts.max_mem = MAX_MEM
    opts.never_nl = True
    try:
        prefilter = re2.compile(pattern, opts)
    except re2.error:
        return Trigger(rules, re.compile(pattern), None, exception_only)
    set_opts = re2.Options()
    set_opts.max_mem = MAX_MEM
    rule_set = re2.Set.SearchSet(set_opts)
    for r in rules.rules:
        if rule_set.Add(r.regex.pattern.encode()) != r.priority:  # pragma: no cover
            return Trigger(rules, prefilter, None, exception_only)
    rule_set.Compile()
    return Trigger(rules, prefilter, rule_set, exception_only)
