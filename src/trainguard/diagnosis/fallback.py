"""When the rules are silent or weak: the failure families, then the learned model. Pure.

The rules (rules.yaml) decide whenever one of them names a cause. They are *weak* when the
verdict is a symptom, a hint, an exit with no line, `other`, or none at all although the
logs show an error; then the candidate lines (every finding and each file's last lines) are
scored by the failure families (families.yaml) and by the naive Bayes model (model.json):

1. a family signature with support >= FAMILY_MIN (a structure, not one word) gives its
   category and the line that supports it;
2. else the model, when its posterior is >= MODEL_MIN, gives its category and the line whose
   words weigh most for it;
3. the answer replaces the rules' verdict only when it is more confident than it.

A generic exception (no rule knows it: user_code_error) whose own line belongs to a family
with support >= RELABEL_MIN takes that family's category (`RuntimeError: File x.pt cannot be
opened` is a checkpoint's problem). Every answer keeps the line that decided it as evidence
and says which layer decided (`rule`: `family:<category>`, `model`, or `fallback` for the
last error line when nothing supports more).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

from trainguard.diagnosis.candidates import reports_success
from trainguard.diagnosis.families import Families, best_line, load_families
from trainguard.diagnosis.findings import Finding
from trainguard.diagnosis.learned import Model, load_model, predict
from trainguard.diagnosis.taxonomy import Category, Culprit, Diagnosis
from trainguard.diagnosis.trend import memory_full, memory_growth

FAMILY_MIN = 2.5
RELABEL_MIN = 2.9
MODEL_MIN = 0.99
WEAK = 0.45  # a verdict below this confidence is weak (hints, bare exits, `other`)
GENERIC = 0.6  # a generic exception at least this sure is relabelled, not replaced
# a context line that shows an error although no rule or exception pattern took it
# (or an exception's message quoted without its type: `'str' object has no attribute 'size'`;
# or the innermost frame of a traceback the log ends in, cut before its exception line: the
# only frames kept as context, its start whole or cut mid-path: `File "/usr/lib/python3.7/dist-`;
# or a frame quoted (`>   File "x.py", ...`), printed as `File: "x.py"` or cut at its start; or
# a traceback's header glued to a progress bar or cut at its first letter; or a `Couldn't
# reconnect to ...`, `Unable to connect to ...`, `Out of Memory: ...`, `Data loss: ...`, `...
# was not successful`; or the Chinese words for an error or a failure, `...错误`, `报错`,
# `失败`, in an issue's prose around a quoted message; or TensorFlow's op error as a graph
# prints it, `Node: '...'` then the message then `[[{{node ...}}]]`, its exception line cut;
# or a pool's worker `terminated abruptly`; or a pod `Evicted`; or TensorFlow's op_kernel.cc
# line, which it logs (at W) only for an op that failed, `Invalid argument: ...`)
_ERRORISH = re.compile(r"\b(?:error|fatal|fail(?:ed|ure)?|exception|killed|abort(?:ed)?|panic|"
                       r"critical|(?:could(?:n['\u2019]?t| not)|unable to) \w+|out of memory|"
                       r"data loss|(?:not |un)successful)\b"
                       r"|错误|報錯|报错|出错|出錯|失败|失敗"
                       r"|[a-z](?:Error|Exception|EnforceNotMet)\b"
                       r"|raceback \(most recent call"
                       r'|^(?:>\s*)?File:? "|\.py", line \d+, in \S+$'
                       r"|\bobject (?:has no attribute|is not (?:callable|subscriptable|iterable))"
                       r"|\b[EF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [\w./-]+:\d+\]"
                       r"|^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [EF] [\w./-]+:\d+\]"
                       r"|^Node: '|\[\[\{\{node |terminated abruptly|(?-i:\bEvicted\b)"
                       r"|\bop_kernel\.cc:\d+\] ",
                       re.IGNORECASE)
# two shapes an operation compared: the target's and the input's (two tensors' sizes at one
# dimension, `must match the size of tensor b ... at non-singleton dimension 1`, are the
# code's: both such cases of the sets are labelled user_code_error)
_SHAPES = re.compile(r"[Tt]arget size \((?:torch\.Size\()?\[([\d, ]*)\]\)?\) must be the same as "
                     r"input size \((?:torch\.Size\()?\[([\d, ]*)\]")
# an index that is exactly the size of its dimension: one more class or token than the count
# the configuration sets (`index 18864 is out of bounds for dimension 1 with size 18864`)
_INDEX = re.compile(r"\bindex (\d+) is out of bounds for (?:dimension|axis) \d+ with size (\d+)")
_SIZES = re.compile(r"sizes? (?:do(?:es)? not|don't) match|size mismatch|must match the size",
                    re.IGNORECASE)
_OPTIM_STEP = re.compile(r'[/\\]optim[/\\]\w+\.py", line \d+, in (?:step|_\w+)$')
# a KeyError's missing key, and a source line that reads that key from the run's settings
# (`config["experiment"]["sample_step"]`, `int(net_options['max_epochs'])`, or what a call on
# the settings returns, `conf.compile(conf.load(args['exp']))['Experiment']`): the
# configuration lacks a key the code needs (an outdated or incomplete config file)
_KEY_ERROR = re.compile(r"""^(?:[\w.]+\.)?KeyError: ['"]([\w.-]+)['"]\s*$""")
_SETTINGS = (r"""\b(?:\w+_)?(?:args|cfg|config|conf|opts?|options|hparams|hyp|params|"""
             r"""settings)\w*(?:\.\w+|\((?:[^()\n]|\([^()\n]*\))*\))*(?:\[[^\]]*\])*"""
             r"""\[\s*['"]{key}['"]\s*\]""")
# ... or from a checkpoint (`checkpoint['model_state_dict']`, `state_dict["optimizer"]`): what
# was loaded lacks what the code reads from it (round 33: all 7 such logs of the sets are
# checkpoint_load_error)
_CHECKPOINT = (r"""\b\w*(?:checkpoint|ckpt|state_dict|snapshot)\w*(?:\.\w+)*(?:\[[^\]]*\])*"""
               r"""\[\s*['"]{key}['"]\s*\]""")
_ADVICE = {
    "family": "No rule knows this wording; the line matches the {cat} family (words: "
              "{why}). Check it, and add a rule (rules.yaml) if it is right.",
    "none": "No rule and no failure family knows this line, the last error line the logs "
            "show; read the lines before it.",
    "trend": "The job's host memory grew from {why} and the log stops with no error: most "
             "likely the kernel's OOM killer (check dmesg); find what grows (caches, "
             "leaks, workers) or use a bigger node.",
    "full": "The job's host memory was {why} used when the log stops with no error: most "
            "likely the kernel's OOM killer (check dmesg); lower host memory (offload, "
            "workers, caches) or use a bigger node.",
    "model": "No rule knows this wording; the trained model reads it as {cat} (its words: "
             "{why}). Check it, and add a rule (rules.yaml) if it is right.",
}


def family_advice(cat: Category, why: str) -> str:
    """The advice of an answer a failure family gave (no rule knows the wording)."""
    return _ADVICE["family"].format(cat=cat.value, why=why)


def _lines(findings: Sequence[Finding]) -> list[Finding]:
    """Candidate lines in reading order: by file (as first seen), then position."""
    order: dict[str, int] = {}
    for f in findings:
        order.setdefault(f.file, len(order))
    return sorted(findings, key=lambda f: (order[f.file], f.offset))


def _answer(f: Finding, cat: Category, conf: float, how: str, why: str,
            fam: Families) -> Diagnosis:
    domain, restart = fam.defaults[cat]
    who = f"rank {f.rank}: " if f.rank is not None else ""
    return Diagnosis(
        cat, domain, restart, f"{who}{f.text.strip()[:300]}",
        _ADVICE[how].format(cat=cat.value, why=why), Culprit(f.rank, f.node),
        f.evidence(),
        isolate_node=cat == Category.GPU_HARDWARE,  # its words name the machine
        confidence=round(conf, 2), subcategory="fallback",
        rule={"family": f"family:{cat.value}", "trend": f"family:{cat.value}",
              "full": f"family:{cat.value}", "model": "model"}.get(how, "fallback"),
        from_log=True)


def _fallback(lines: list[Finding], fam: Families, model: Model | None,
              visible: bool, reread: str | None = None) -> Diagnosis | None:
    # lines a rule already judged (a symptom, a hint) are not read again as a family's, but
    # for those of the rule `reread` (a rule that named no cause: `other`); nor is a line
    # logged at INFO that names no failure (it reports what went well)
    support = best_line(fam, [("" if (f.rule and f.rule != reread) or reports_success(f.text)
                               else f.text, not f.context) for f in lines])
    if support is not None and support.score >= FAMILY_MIN:
        f = lines[support.index]
        return _answer(f, support.category, min(0.3 + 0.08 * support.score, 0.7), "family",
                       fam.words(f.text, support.category), fam)
    # the model reads only lines that show an error: an ordinary line (`step 2 loss 3.42`)
    # is no failure, whatever words it shares with one
    shown = [f for f in lines if not f.context or _ERRORISH.search(f.text)]
    pred = predict(model, [f.text for f in shown]) if model is not None and shown else None
    if pred is not None and pred.line >= 0 and pred.probability >= MODEL_MIN:
        return _answer(shown[pred.line], Category(pred.category),
                       0.3 + 0.25 * pred.probability, "model", ", ".join(pred.features), fam)
    if not visible:
        return None
    # an error is visible and nothing supports more: `other`, on the last error line
    errors = [f for f in lines if not f.context or _ERRORISH.search(f.text)]
    if support is not None:
        f = lines[support.index]
        return _answer(f, support.category, 0.3, "family",
                       fam.words(f.text, support.category), fam)
    return _answer(errors[-1], Category.OTHER, 0.2, "none", "", fam) \
        if errors else None


def count_mismatch(text: str) -> bool:
    """Two shapes of the same rank that differ in one dimension other than the first (the
    batch), or an index exactly at its dimension's size: a count the configuration sets
    (classes, channels, features, a vocabulary) does not fit the data or the model. Shapes
    of different ranks, a different batch, or an index further out are the code's."""
    m = _INDEX.search(text)
    if m is not None:
        return m.group(1) == m.group(2)
    m = _SHAPES.search(text)
    if m is not None:
        a, b = ([int(n) for n in g.split(",") if n.strip()] for g in m.groups())
        diff = [i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y]
        return len(a) == len(b) > 1 and len(diff) == 1 and diff[0] > 0
    return False


def setting_missing(text: str, src: str, mapping: str = _SETTINGS) -> bool:
    """A KeyError whose source line reads the missing key from the run's settings (a
    mapping named args, cfg, config, options, hparams, params, settings...; or, `mapping`
    _CHECKPOINT, from a checkpoint)."""
    m = _KEY_ERROR.match(text.strip())
    return m is not None and re.search(mapping.format(key=re.escape(m.group(1))), src,
                                       re.IGNORECASE) is not None


def _optimizer_state_mismatch(d: Diagnosis, findings: Sequence[Finding]) -> bool:
    """Sizes that do not match raised inside an optimizer's step (its innermost frame): its
    state (momentum, moments) shaped unlike the parameters comes only from a restored
    optimizer state, a checkpoint that does not fit."""
    ev = d.evidence
    return ev is not None and _SIZES.search(ev.text) is not None and any(
        f.context and f.file == ev.file and ev.line - 3 < f.line < ev.line
        and _OPTIM_STEP.search(f.text) for f in findings)


def _relabel(d: Diagnosis, fam: Families, findings: Sequence[Finding]) -> Diagnosis:
    """A generic exception whose own line belongs to a family (with the next line when its
    message starts there: `ValueError:` and the message below it)."""
    ev = d.evidence
    if ev is None:
        return d
    text = ev.text.rstrip()
    if text.endswith(":"):
        text += " " + next((f.text for f in findings if f.file == ev.file
                            and f.line == ev.line + 1), "")
    scores = fam.scores(text)
    scores.pop(Category.USER_CODE_ERROR, None)
    # the source line that raised it (the innermost frame's, the line above)
    src = next((f.text for f in findings if f.context and f.file == ev.file
                and f.line == ev.line - 1), "")
    missing = setting_missing(text, src)
    if missing or count_mismatch(text):
        scores[Category.CONFIG_ERROR] = RELABEL_MIN
    # ... loads a checkpoint or a state dict (`opt.load_state_dict(ckpt['optimizer'])` ->
    # KeyError): what was loaded does not hold what the code reads from it
    ckpt = fam.scores(src).get(Category.CHECKPOINT_LOAD_ERROR, 0.0) if src else 0.0
    if _optimizer_state_mismatch(d, findings):
        ckpt, src = RELABEL_MIN, text
    elif src and setting_missing(text, src, _CHECKPOINT):
        ckpt = max(ckpt, RELABEL_MIN)
    if ckpt >= RELABEL_MIN and max(scores.values(), default=0.0) < RELABEL_MIN:
        scores[Category.CHECKPOINT_LOAD_ERROR] = ckpt
        text = src
    if not scores:
        return d
    cat, score = max(scores.items(), key=lambda kv: kv[1])
    if score < RELABEL_MIN:
        return d
    domain, restart = fam.defaults[cat]
    why = fam.words(text, cat) or ("a key the run's settings lack" if missing else
                                   "a key the checkpoint lacks"
                                   if cat == Category.CHECKPOINT_LOAD_ERROR else
                                   "a count that does not fit the data or the model")
    return replace(d, category=cat, fault_domain=domain, restart_helps=restart,
                   subcategory=d.subcategory, rule=f"family:{cat.value}",
                   confidence=round(min(d.confidence, 0.3 + 0.08 * score), 2),
                   advice=_ADVICE["family"].format(cat=cat.value, why=why))


def refine(d: Diagnosis | None, findings: Sequence[Finding], *,
           families: Families | None = None, model: Model | None = None,
           use_model: bool = True) -> Diagnosis | None:
    """The rules' verdict `d`, or a better supported one when it is silent or weak."""
    generic = d is not None and d.category == Category.USER_CODE_ERROR \
        and d.evidence is not None and d.confidence >= GENERIC \
        and (d.rule is None or count_mismatch(d.evidence.text)
             or _optimizer_state_mismatch(d, findings))
    if d is not None and not generic and ((d.confidence >= WEAK and d.category !=
                                           Category.OTHER) or d.subcategory == "node_lost"):
        return d
    if not findings:
        return d
    fam = families or load_families()
    if d is not None and generic:
        return _relabel(d, fam, findings)
    lines = _lines(findings)
    if d is not None and (d.subcategory or "").startswith("exit_code_") \
            and d.culprit.rank is not None:
        # a rank exited non-zero saying nothing: its peers' errors came after it and are
        # what its exit did to them (a reset connection), never its cause
        lines = [f for f in lines if f.rank in (None, d.culprit.rank)]
        if not lines:
            return d
    visible = any(not f.context or _ERRORISH.search(f.text) for f in lines)
    # with no verdict and no error line, only a family's structure may speak (a `Killed`
    # on a progress line), never the model's reading of ordinary lines
    mdl = (model or load_model()) if use_model and (visible or d is not None) else None
    reread = d.rule if d is not None and d.category == Category.OTHER else None
    alt = _fallback(lines, fam, mdl, visible and d is None, reread)
    if alt is None and d is None:  # nothing printed why: host memory grown or full at the end
        texts = [f.text for f in lines]
        grew = memory_growth(texts)
        full = memory_full(texts) if grew is None else None
        if grew is not None:
            at, first, peak = grew
            alt = _answer(lines[at], Category.HOST_OOM, 0.4, "trend",
                          f"{first:.1f} to {peak:.1f} GiB", fam)
        elif full is not None:
            alt = _answer(lines[full[0]], Category.HOST_OOM, 0.4, "full", f"{full[1]:g}%", fam)
    if alt is None or (d is not None and (alt.category == d.category
                                          or alt.confidence <= d.confidence)):
        return d
    if d is not None:  # what the rules saw becomes a symptom the answer explains
        seen = (d.evidence,) if d.evidence is not None else ()
        alt = replace(alt, symptoms=(*seen, *d.symptoms)[:10])
    return alt

