"""The failure signatures (rules.yaml): every rule matches the real lines it cites, and
parse_rules names the rule and key of a mistake."""

from __future__ import annotations

import pytest

from trainguard.diagnosis.rules import Example, Rule, load_rules, parse_rules
from trainguard.diagnosis.scan import compile_trigger, scan_bytes
from trainguard.errors import RulesError

RULES = load_rules()
TRIGGER = compile_trigger(RULES)

EXAMPLES = [
    pytest.param(rule, example, id=f"{rule.id}-{i}")
    for rule in RULES.rules
    for i, example in enumerate(rule.examples)
]


def rules_on(line: str) -> list[str | None]:
    """The rule of each finding the scanner makes of one log line."""
    return [f.rule for f in scan_bytes(RULES, TRIGGER, "x.log", [line.encode() + b"\n"])]


@pytest.mark.parametrize(("rule", "example"), EXAMPLES)
def test_example_line_gets_its_rule(rule: Rule, example: Example) -> None:
    got = rules_on(example.line)
    assert rule.id in got, (
        f"{rule.id}: example from {example.source} got {got or 'no finding'}: {example.line!r}"
    )


def test_every_rule_has_an_example() -> None:
    missing = [r.id for r in RULES.rules if not r.examples]
    assert not missing, f"rules without a real example line: {', '.join(missing)}"


def test_example_sources_are_links() -> None:
    for rule in RULES.rules:
        for example in rule.examples:
            assert example.source.startswith(("https://", "http://")), rule.id
            assert example.line.strip(), f"{rule.id}: empty example line"


# -- parse_rules rejects mistakes, naming the rule and the key --------------------------------

RULE = """\
  - id: {id}
    category: {category}
    domain: hardware
    restart: {restart}
    pattern: '{pattern}'
    advice: Drain the node.
{extra}"""


def rules_text(*rules: str) -> str:
    return "version: 1\nrules:\n" + "".join(rules)


def rule_yaml(
    rule_id: str = "my-rule",
    category: str = "gpu_hardware",
    restart: str = '"yes"',
    pattern: str = "Xid",
    extra: str = "",
) -> str:
    return RULE.format(id=rule_id, category=category, restart=restart, pattern=pattern, extra=extra)


def test_valid_rules_text_parses() -> None:
    other = rule_yaml(rule_id="other-rule", extra="    isolate: true\n")
    rs = parse_rules(rules_text(rule_yaml(), other))
    assert [r.id for r in rs.rules] == ["my-rule", "other-rule"]
    assert rs.by_id("other-rule").isolate


@pytest.mark.parametrize(
    ("text", "key"),
    [
        pytest.param(rules_text(rule_yaml(restart="yes")), "restart", id="bare-yes"),
        pytest.param(rules_text(rule_yaml(restart="no")), "restart", id="bare-no"),
        pytest.param(rules_text(rule_yaml(pattern="(unclosed")), "pattern", id="bad-regex"),
        pytest.param(rules_text(rule_yaml(category="gpu_melted")), "category", id="bad-category"),
        pytest.param(rules_text(rule_yaml(extra="    colour: red\n")), "colour", id="unknown-key"),
    ],
)
def test_mistake_names_rule_and_key(text: str, key: str) -> None:
    with pytest.raises(RulesError) as err:
        parse_rules(text)
    msg = str(err.value)
    assert "my-rule" in msg and f"key {key}" in msg, msg


def test_bare_yes_explains_the_quoting() -> None:
    with pytest.raises(RulesError, match="quoted"):
        parse_rules(rules_text(rule_yaml(restart="yes")))


def test_duplicate_id_names_the_rule() -> None:
    with pytest.raises(RulesError) as err:
        parse_rules(rules_text(rule_yaml(), rule_yaml(pattern="SXid")))
    msg = str(err.value)
    assert "my-rule" in msg and "id" in msg and "unique" in msg, msg


def test_the_re2_rule_set_picks_the_same_rule_as_python_re_on_every_corpus_line() -> None:
    """The scanner asks an RE2 set which rules may match, then confirms with Python's re:
    it must agree with trying every rule in order (RuleSet.match), line by line."""
    from pathlib import Path

    from trainguard.diagnosis.lines import split_prefix
    from trainguard.diagnosis.prefilter import compile_trigger

    rules = load_rules()
    trigger = compile_trigger(rules)
    assert trigger.rule_set is not None
    data = Path(__file__).resolve().parents[1] / "data" / "diagnosis"
    texts: dict[str, str] = {}  # each distinct line once (a quarter repeat), with its log
    for log in sorted(data.glob("*/*/*.log")):
        for raw in log.read_text(encoding="utf-8", errors="replace").splitlines():
            texts.setdefault(split_prefix(raw).text, log.parent.name)
    for text, case in texts.items():
        first = rules.match(text, is_exception=True)  # the first rule matching at all
        for exc in (False, True):
            # (an exception line's answer is an ordinary line's unless it is an
            # exception-only rule: RuleSet.match is asked again only then, half the time)
            want = rules.match(text, is_exception=exc) if (
                not exc and first is not None and first.exception) else first
            got = trigger.match(text, is_exception=exc)
            assert got is want, (case, text[:200], want and want.id, got and got.id)
    assert len(texts) > 5_000


@pytest.mark.parametrize(("text", "want"), [
    ("rules: []\n", "rules: version: is required. Fix: add it (a rules file is YAML"),
    ("version: 1\nrules: x\n", "rules: rules: 'x' is not a list. Fix: make it a list"),
])
def test_a_malformed_rules_file_is_told_in_plain_words_with_the_fix(text: str, want: str
                                                                    ) -> None:
    """Walk-through 10: `version: Field required`, `rules: Input should be a valid list`."""
    with pytest.raises(RulesError) as err:
        parse_rules(text)
    assert str(err.value).startswith(want), str(err.value)
    assert "Input should" not in str(err.value) and "Field required" not in str(err.value)


# -- words: one message's translations, named by more than one pattern --------------------------

def words_text(words: str, *rules: str) -> str:
    return "version: 1\nwords:\n" + words + "rules:\n" + "".join(rules)


def test_a_pattern_names_words_and_gets_them_as_one_group() -> None:
    rs = parse_rules(words_text("  segv: ['段错误', 'Speicherzugriffsfehler']\n",
                                rule_yaml(pattern="^{{segv}} \\(core\\)$")))
    rule = rs.by_id("my-rule")
    assert rs.words == {"segv": "(?:段错误|Speicherzugriffsfehler)"}
    assert rule.regex.pattern == "^(?:段错误|Speicherzugriffsfehler) \\(core\\)$"
    assert rs.match("Speicherzugriffsfehler (core)") is rule
    assert rs.match("段错误 (core)") is rule
    assert rs.match("Speicherzugriffsfehler") is None


def test_a_pattern_naming_undefined_words_names_the_rule_and_the_words() -> None:
    with pytest.raises(RulesError) as err:
        parse_rules(words_text("  segv: ['x']\n", rule_yaml(pattern="{{segfault}}")))
    msg = str(err.value)
    assert "my-rule" in msg and "'segfault'" in msg and "defined: segv" in msg, msg


def test_words_that_break_the_pattern_name_the_rule() -> None:
    with pytest.raises(RulesError) as err:
        parse_rules(words_text("  bad: ['(unclosed']\n", rule_yaml(pattern="{{bad}}")))
    assert "my-rule" in str(err.value) and "words" in str(err.value), str(err.value)


def test_the_shell_crash_verdict_reads_the_shipped_translations() -> None:
    """restart.py's shell job line and rules.yaml's native-crash read one table: a locale
    added to `words:` is known to both."""
    from trainguard.diagnosis.restart import _shell_segv

    words = load_rules().words
    assert "Speicherzugriffsfehler" in words["segfault"]
    for seg, core in (("段错误", "核心已转储"),
                      ("Speicherzugriffsfehler", "Speicherabzug geschrieben")):
        line = f"{seg} ({core})"
        assert _shell_segv().search(line), line
        assert load_rules().match(line) is load_rules().by_id("native-crash"), line
