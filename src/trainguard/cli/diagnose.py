"""`trainguard diagnose PATH... [--json]`: the root cause of a failure, from its logs.

PATH is a job dir (its attempt logs and worker exits are used), a directory of logs, or
log files of any origin (torchrun, DeepSpeed, srun -l, plain consoles; .gz too).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from trainguard.cli.diagnose_job import job_reader
from trainguard.cli.fmt import complain
from trainguard.controller.store import holds_job_dirs
from trainguard.diagnosis.rules import RuleSet, load_rules, parse_rules
from trainguard.diagnosis.sources import Report, diagnose_paths
from trainguard.diagnosis.taxonomy import HANG, Diagnosis
from trainguard.errors import RulesError
from trainguard.exitcodes import ExitCode


def add_diagnose_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "diagnose", help="name the root cause of a failed job from its logs",
        description="Name the root cause of a failed (or hung) job: reads every rank's log, "
                    "orders the errors, and tells the first real cause from its symptoms.")
    p.add_argument("paths", nargs="+", type=Path, metavar="PATH",
                   help="a job dir, a directory of logs, or log files")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--attempt", type=int, help="for a job dir: the attempt to diagnose "
                   "(default: the last one that failed)")
    p.add_argument("--rules", type=Path, metavar="FILE",
                   help="a rules file to use instead of the built-in one (same format as "
                   "trainguard/diagnosis/rules.yaml)")
    p.set_defaults(func=_run)


def _rules(path: Path | None) -> RuleSet:
    if path is None:
        return load_rules()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise RulesError(f"cannot read the rules file {path}: {e}") from e
    return parse_rules(text, str(path))


def _run(ns: argparse.Namespace) -> int:
    refused = next((why for p in ns.paths if (why := _not_one_failure(p))), None)
    if refused is not None:
        complain("diagnose", refused)
        return ExitCode.USAGE
    report = diagnose_paths(ns.paths, rules=_rules(ns.rules), read_job=job_reader(ns.attempt))
    if ns.json:
        print(json.dumps(to_json(report), indent=2))
    else:
        print(render(report))
    for problem in report.problems:
        complain("diagnose", problem, "warning")
    return ExitCode.SUCCESS if report.diagnosis is not None else ExitCode.NOTHING_FOUND


def _not_one_failure(p: Path) -> str | None:
    """Why `p` is no log of one failure, or None: source code (its lines would read as
    errors) or a folder of jobs (their logs would mix into one verdict)."""
    if p.is_file() and p.suffix in (".py", ".yaml", ".yml"):
        return (f"{p} is a {'script' if p.suffix == '.py' else 'job file'}, not a log. Fix: "
                "give the job dir (`trainguard ls` lists them) or its log files")
    if holds_job_dirs(p):
        return (f"{p} holds job dirs, not one job's logs. Fix: diagnose one of them "
                f"(`trainguard ls {p}` lists them)")
    return None


def to_json(report: Report) -> dict[str, object]:
    return {"diagnosis": None if report.diagnosis is None else report.diagnosis.to_dict(),
            "job_dir": report.job_dir, "attempt": report.attempt,
            "attempt_failed": report.attempt_failed, "note": report.note,
            "files": report.files, "problems": report.problems}


def render(report: Report) -> str:
    d = report.diagnosis
    read = f"read {len(report.files)} file(s)" + (
        f" of attempt {report.attempt} of {report.job_dir}" if report.job_dir else "")
    if d is None and report.note is not None and not report.files:
        return (f"no failure found: {report.note}; `--attempt N` reads the logs of one "
                "anyway")
    if d is None:
        why = f"{report.note}, and" if report.note else "no failure found:"
        return f"{why} no known error, exception or failed rank ({read})"
    head = [] if report.note is None else [
        f"{report.note}: no failure; the errors its logs show anyway, read as a failure:"]
    return "\n".join([*head, *_verdict_lines(d), f"  ({read})"])


def _verdict_lines(d: Diagnosis) -> list[str]:
    out = [f"{d.category.value}" + (f" ({d.subcategory})" if d.subcategory else "")
           + f"{d.library_note}: {d.summary}",
           f"  restart helps: {d.restart_helps.value} · fault domain: {d.fault_domain.value}"
           f" · isolate node: {'yes' if d.isolate_node else 'no'}"
           f" · confidence: {d.confidence:.2f}"]
    who = []
    if d.culprit.rank is not None:
        who.append(f"rank {d.culprit.rank}")
    if d.culprit.node:
        who.append(f"node {d.culprit.node}")
    if d.culprit.frame:
        where = " (from inside a library it called)" if d.culprit.in_library else ""
        verb = "waiting at" if d.subcategory == HANG else "raised at"  # a hang raised nothing
        who.append(f"{verb} {d.culprit.frame}{where}")
    if who:
        out.append(f"  culprit: {', '.join(who)}")
    if d.evidence is not None:
        ranks = f"  [{d.evidence.count} ranks printed it]" if d.evidence.count > 1 else ""
        out += [f"  evidence: {d.evidence.where()}{ranks}",
                f"    {d.evidence.text.strip()[:400]}",
                *(f"      {t[:400]}" for t in d.evidence.more)]
    out.append(f"  advice: {d.advice}")
    if d.symptoms:
        out.append(f"  symptoms it explains ({len(d.symptoms)}):")
        for s in d.symptoms:
            more = f"  [{s.count} ranks]" if s.count > 1 else ""
            rank = f"rank {s.rank}: " if s.rank is not None else ""
            out.append(f"    {s.where()}  {rank}{s.text.strip()[:200]}{more}")
    return out
