"""An abort that an uncaught C++ exception explains: the exception's cause decides. Pure.

`terminate called after throwing an instance of 'gloo::IoException'`, then `what(): ...
connect [10.0.0.2]:3210: Connection refused`, then `Aborted (core dumped)`: the abort is
what std::terminate does to any exception nobody caught, a symptom; the `what():` line says
why. The rules read the abort (a weak native crash) before a `what():` line that only a
symptom rule or a failure family knows (a refused connection, an interface the machine
lacks), so that line's category is taken here, with the line as evidence and the abort
among the symptoms; glog's fatal message (`F0720 ... grpc_client.cc:276] ... Deadline
Exceeded`) above its `Check failure stack trace` and the abort is read the same way. So,
likewise, is the rule's verdict on the next line of an exception no
rule knows whose message goes on there, or that names only the source line that raised
it (`continued_message`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from trainguard.diagnosis.fallback import FAMILY_MIN, family_advice
from trainguard.diagnosis.families import load_families
from trainguard.diagnosis.findings import Finding
from trainguard.diagnosis.rules import RuleSet
from trainguard.diagnosis.taxonomy import Category, Diagnosis

_ABORT = re.compile(r"\bAbort(?:ed)?\b|SIGABRT", re.IGNORECASE)
_WHAT = re.compile(r"(?:^|[\s:>\]])what\(\):\s")
_NEAR = 4  # lines between the terminate line, its what() and the abort
# glog's fatal message (`F0720 09:45:08.417428   591 grpc_client.cc:276] ... meets grpc
# error:Deadline Exceeded`), then `*** Check failure stack trace: ***` and the abort: the
# message says why, as a what() line does
_GLOG_FATAL = re.compile(r"^F\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ [\w.-]+:\d+\] ")
_CHECK_TRACE = re.compile(r"Check failure stack trace", re.IGNORECASE)
# VS Code's debugger names the exception on a line of its own, its message on the next
_DEBUGGER = re.compile(r"^\s*Exception has occurred: [\w.]+\s*$")
# a C++/CUDA extension that raises with where it stopped (`RuntimeError: /io/build/.../
# ConvMainUnitTest_implicit_gemm2.cu 3187`) and says what went wrong on the next line
_WHERE_ONLY = re.compile(r"(?:Error|Exception): \S+\.(?:cu|cuh|cc|cpp|cxx|c|h|hpp)(?::| )\d+\s*$")
_NOT_A_CAUSE = (Category.SEGFAULT_OR_ABORT, Category.OTHER, Category.USER_CODE_ERROR)


def continued_message(d: Diagnosis | None, findings: Sequence[Finding],
                      rules: RuleSet) -> Diagnosis | None:
    """`d`, or the rule's verdict on the next line when `d` is an exception no rule knows
    whose message goes on there (`RuntimeError: Resource exhausted: From /job:tpu_worker/..:`
    then `Attempting to reserve 3.95G at the bottom of memory. That was not possible.`), or
    on the line after that when the next one ends with `:` too; as VS Code's `Exception has
    occurred: RuntimeError` above its message and an extension's exception whose message is
    only its source file and line (`....cu 3187`)."""
    ev = d.evidence if d is not None else None
    goes_on = ev is not None and ev.text.rstrip().endswith(":")
    if d is None or ev is None or d.rule is not None or d.category != Category.USER_CODE_ERROR \
            or not (goes_on or _DEBUGGER.match(ev.text) or _WHERE_ONLY.search(ev.text)):
        return d
    nxt = _line_after(findings, ev.file, ev.line)
    # ... or the one after it when the message goes on over two lines, each ending with `:`
    # (DALI's `RuntimeError: Critical error in pipeline:`, then `Error when executing Mixed
    # operator ImageDecoder encountered:`, then `CUDA allocation failed`)
    if nxt is not None and not nxt.rule and goes_on and nxt.text.rstrip().endswith(":"):
        nxt = _line_after(findings, ev.file, nxt.line)
    rule = rules.by_id(nxt.rule) if nxt is not None and nxt.rule else None
    if nxt is None or rule is None or rule.category in _NOT_A_CAUSE:
        return d
    return _decided_by(
        d, nxt, category=rule.category, fault_domain=rule.domain, restart_helps=rule.restart,
        advice=rule.advice, summary=f"{ev.text.strip()[:150]} {nxt.text.strip()[:150]}",
        subcategory=rule.subcategory, rule=rule.id, isolate_node=rule.isolate)


def _line_after(findings: Sequence[Finding], file: str, line: int) -> Finding | None:
    return next((f for f in findings if f.file == file and f.line == line + 1), None)


def _decided_by(d: Diagnosis, f: Finding, **verdict: Any) -> Diagnosis:
    """`d` with `f` as its deciding line and `verdict`'s fields; `d`'s own line becomes the
    first symptom."""
    assert d.evidence is not None
    return replace(d, evidence=f.evidence(),
                   symptoms=(d.evidence, *d.symptoms)[:10], **verdict)


def explained_abort(d: Diagnosis | None, findings: Sequence[Finding],
                    rules: RuleSet) -> Diagnosis | None:
    """`d`, or the cause the `what():` line of the uncaught exception names when `d` is the
    abort that exception caused (or, first, `continued_message`'s verdict)."""
    d = continued_message(d, findings, rules)
    ev = d.evidence if d is not None else None
    if d is None or ev is None or d.rule != "native-crash":
        return d
    mine = [f for f in findings if f.file == ev.file and ev.line - _NEAR <= f.line < ev.line]
    if _CHECK_TRACE.search(ev.text):  # glog's fatal message, the line(s) above its trace
        what = next((f for f in reversed(mine) if _GLOG_FATAL.match(f.text)), None)
    elif _ABORT.search(ev.text) and any(f.rule == "abort-after-exception" for f in mine):
        what = next((f for f in reversed(mine) if _WHAT.search(f.text)), None)
    else:
        return d
    if what is None:
        return d
    rule = rules.by_id(what.rule) if what.rule else None
    if rule is not None and rule.category not in _NOT_A_CAUSE:
        cat, domain, restart, advice = rule.category, rule.domain, rule.restart, rule.advice
    else:
        fam = load_families()
        scores = {c: s for c, s in fam.scores(what.text).items() if c not in _NOT_A_CAUSE}
        if not scores:
            return d
        cat, score = max(scores.items(), key=lambda kv: kv[1])
        if score < FAMILY_MIN:
            return d
        domain, restart = fam.defaults[cat]
        advice = family_advice(cat, fam.words(what.text, cat))
    who = f"rank {what.rank}: " if what.rank is not None else ""
    sub = "glog_fatal" if _GLOG_FATAL.match(what.text) else "uncaught_exception"
    return _decided_by(
        d, what, category=cat, fault_domain=domain, restart_helps=restart, advice=advice,
        summary=f"{who}{what.text.strip()[:300]}", subcategory=sub,
        rule=rule.id if rule is not None and rule.category == cat else f"family:{cat.value}",
        isolate_node=cat == Category.GPU_HARDWARE)
