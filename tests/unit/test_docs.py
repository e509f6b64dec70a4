"""The docs say what the code does: every `trainguard ...` command line in a code block of
README.md and docs/*.md parses with the real argument parser (the flags exist, required
arguments are there), and every relative link in them resolves to a file in the repository.

A command line is one that starts with `trainguard` (after a `$ ` prompt and `VAR=value`
assignments), `\\` continuations joined; a `# comment`, a pipe or a redirection ends it.
Placeholders stay words (`JOB_DIR`, `<run id>`, `LOG...`), optional parts (`[--json]`) are
taken as given. Lines that only mention trainguard (output, tables) are not commands.
"""

from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from trainguard.cli import parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^\s*(```|~~~)")
PROGRAMS = ("trainguard", ".venv/bin/trainguard")
ENV_ASSIGNMENT = re.compile(r"^[A-Z_][A-Z0-9_]*=")
PLACEHOLDER = re.compile(r"<[^<>]+>")
ENDS = {"|", "||", "&&", ";", ">", ">>", "2>&1", "&", "2>", "<"}
LINK = re.compile(r"!?\[[^\]]*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_SPAN = re.compile(r"`[^`]*`")


def code_blocks(text: str) -> Iterator[list[tuple[int, str]]]:
    """Each fenced block's lines with their 1-based numbers."""
    block: list[tuple[int, str]] | None = None
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            if block is None:
                block = []
            else:
                yield block
                block = None
        elif block is not None:
            block.append((n, line))


def joined(block: list[tuple[int, str]]) -> Iterator[tuple[int, str]]:
    """Lines with their `\\` continuations joined, numbered by their first line."""
    start, parts = 0, []
    for n, line in block:
        if not parts:
            start = n
        if line.rstrip().endswith("\\"):
            parts.append(line.rstrip()[:-1])
            continue
        parts.append(line)
        yield start, " ".join(p.strip() for p in parts)
        parts = []
    if parts:
        yield start, " ".join(p.strip() for p in parts)


def command_argv(line: str) -> list[str] | None:
    """The arguments after `trainguard` on a command line; None: not a command."""
    text = line.strip().removeprefix("$ ")
    text = PLACEHOLDER.sub(lambda m: re.sub(r"\W+", "_", m.group(0)).strip("_").upper(), text)
    try:
        words = shlex.split(text, comments=True)
    except ValueError:
        return None
    while words and ENV_ASSIGNMENT.match(words[0]):
        words = words[1:]
    if not words or words[0] not in PROGRAMS or (len(words) > 1 and words[1].endswith(":")):
        return None  # `trainguard run: error: ...`: what a command printed
    argv = []
    for w in words[1:]:
        if w in ENDS or w.startswith((">", "2>")):
            break
        w = w.strip("[]")  # `[--json]`: an optional part, given
        if w in ("", "...") or w.startswith("|"):
            continue
        argv.append(w.removesuffix("..."))
    return argv


def commands() -> list[tuple[str, list[str]]]:
    found = []
    for path in DOCS:
        for block in code_blocks(path.read_text(encoding="utf-8")):
            for n, line in joined(block):
                argv = command_argv(line)
                if argv is not None:
                    found.append((f"{path.relative_to(ROOT)}:{n}", argv))
    return found


COMMANDS = commands()
PLACEHOLDER_WORD = re.compile(r"[A-Z][A-Z0-9_]*")


@cache
def the_parser() -> argparse.ArgumentParser:
    return parser()


def test_the_docs_show_commands_of_every_kind() -> None:
    verbs = {argv[0] for _, argv in COMMANDS if argv}
    assert {"run", "events", "recovery", "status", "diagnose", "report", "metrics",
            "ui"} <= verbs, verbs


@pytest.mark.parametrize(("where", "argv"), COMMANDS, ids=[w for w, _ in COMMANDS])
def test_every_command_line_in_the_docs_parses_with_the_real_parser(
    where: str, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # a placeholder (JOB_DIR, N, S) stands for a value: any path or number
    values = ["1" if PLACEHOLDER_WORD.fullmatch(a) else a for a in argv]
    try:
        the_parser().parse_args(values)
    except SystemExit as e:
        err = capsys.readouterr().err.strip().splitlines()
        pytest.fail(f"{where}: trainguard {' '.join(argv)}: exit {e.code}: "
                    f"{err[-1] if err else ''}")


def links() -> list[tuple[str, str]]:
    found = []
    for path in DOCS:
        in_block = False
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if FENCE.match(line):
                in_block = not in_block
                continue
            if in_block:
                continue
            for m in LINK.finditer(CODE_SPAN.sub("", line)):
                target = m.group(1)
                if not re.match(r"^[a-z][a-z0-9+.-]*:", target) and not target.startswith("#"):
                    found.append((f"{path.relative_to(ROOT)}:{n}", target))
    return found


LINKS = links()


def test_the_docs_have_relative_links_to_check() -> None:
    assert len(LINKS) > 20


@pytest.mark.parametrize(("where", "target"), LINKS, ids=[f"{w} {t}" for w, t in LINKS])
def test_every_relative_link_in_the_docs_resolves_to_a_file_in_the_repository(
    where: str, target: str
) -> None:
    source = ROOT / where.split(":")[0]
    resolved = (source.parent / target.split("#")[0]).resolve()
    assert resolved.is_relative_to(ROOT), f"{where}: {target} points outside the repository"
    assert resolved.exists(), f"{where}: {target} does not exist"


@pytest.mark.parametrize(("line", "argv"), [
    ("$ trainguard run --config job.yaml", ["run", "--config", "job.yaml"]),
    ("trainguard events runs/x   # what happened (--follow)", ["events", "runs/x"]),
    ("trainguard diagnose JOB_DIR [--attempt N] [--json]",
     ["diagnose", "JOB_DIR", "--attempt", "N", "--json"]),
    ("trainguard diagnose LOG... [--json]", ["diagnose", "LOG", "--json"]),
    ("trainguard events trainguard-runs/<run id> | grep x", ["events", "trainguard-runs/RUN_ID"]),
    ("X='a b' trainguard status j --json > s.json", ["status", "j", "--json"]),
    ("[trainguard] 09:49:34 Info CheckpointSaved: ...", None),
    ("trainguard: error: job file job.yaml: ...", None),
    ("trainguard run: error: job file job.yaml: ...", None),
    ("job: trainguard run --nnodes 2 train.py", None),
])
def test_what_counts_as_a_command_line(line: str, argv: list[str] | None) -> None:
    assert command_argv(line) == argv


def test_cli_md_names_every_event_reason() -> None:
    from trainguard.records import Reason

    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    missing = [r.value for r in Reason if f"`{r.value}`" not in text]
    assert not missing, f"docs/cli.md does not name these event reasons: {missing}"


def test_cli_md_names_every_flag_of_trainguard_run() -> None:
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    sub = next(a for a in the_parser()._actions if isinstance(a, argparse._SubParsersAction))
    run = sub.choices["run"]
    flags = [next(o for o in a.option_strings if o.startswith("--"))
             for a in run._actions if a.option_strings and a.dest != "help"]
    missing = [f for f in flags if not re.search(rf"{re.escape(f)}(?![\w-])", text)]
    assert not missing, f"docs/cli.md does not name these run flags: {missing}"


def test_no_doc_points_at_a_file_outside_the_repository() -> None:
    """A relative path in a code span (`../shared/X.md`) is a link too, in a reader's eyes:
    it must be a file of the repository."""
    outside = []
    for path in DOCS:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for span in re.findall(r"`(\.\./[^`\s]+)`", line):
                target = (path.parent / span).resolve()
                if not (target.is_relative_to(ROOT) and target.exists()):
                    outside.append(f"{path.relative_to(ROOT)}:{n}: {span}")
    assert not outside, outside


def test_the_rule_counts_the_docs_give_are_the_rules_files() -> None:
    import yaml

    rules = yaml.safe_load((ROOT / "src/trainguard/diagnosis/rules.yaml").read_text())
    rules = rules["rules"] if isinstance(rules, dict) else rules
    examples = sum(len(r.get("examples", [])) for r in rules)
    readme = (ROOT / "README.md").read_text()
    diagnosis = (ROOT / "docs/diagnosis.md").read_text()
    assert re.findall(r"rules\.yaml`, (\d+) rules", readme) == [str(len(rules))]
    assert re.findall(r"holds (\d+) rules with (\d+) example lines", diagnosis) == [
        (str(len(rules)), str(examples))]
