"""`trainguard report JOB_DIR [--json]` and `trainguard metrics JOB_DIR [--json]`: read
commands over the job store, like `events|recovery|status` (exit 0, or 2 when no job is at
JOB_DIR)."""

from __future__ import annotations

import argparse
import json
import sys

from trainguard.cli.read import add_job_dir, with_store
from trainguard.controller.store import JobStore
from trainguard.exitcodes import ExitCode
from trainguard.goodput.metrics import exposition, job_metrics
from trainguard.goodput.report import gather, render, report_doc


def add_report_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("report", help="goodput, where the rest went, each incident and advice",
                       description="One page: the job's goodput and badput by cause, each "
                       "incident with its diagnosis and recovery time, and advice (checkpoint "
                       "interval, hang threshold, nodes implicated). Definitions: "
                       "docs/goodput.md.")
    add_job_dir(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=lambda a: with_store("report", a, _report))
    m = sub.add_parser("metrics", help="print the job's Prometheus metrics (text exposition)",
                       description="Print the job's metrics in Prometheus' text format, for a "
                       "node exporter's textfile collector or a finished job; a running job "
                       "also serves them live with `trainguard run --metrics-port`.")
    add_job_dir(m)
    m.add_argument("--json", action="store_true", help="print JSON instead of text: each "
                   "metric family's name, type, help and samples (name, labels, value)")
    m.set_defaults(func=lambda a: with_store("metrics", a, _metrics))


def _report(store: JobStore, args: argparse.Namespace) -> int:
    doc = report_doc(gather(store))
    sys.stdout.write((json.dumps(doc, indent=2) if args.json else render(doc)) + "\n")
    return ExitCode.SUCCESS


def _metrics(store: JobStore, args: argparse.Namespace) -> int:
    if args.json:  # the same families the exposition prints, one collector for both
        doc = [{"name": f.name, "type": f.type, "help": f.documentation,
                "samples": [{"name": x.name, "labels": x.labels, "value": x.value}
                            for x in f.samples]} for f in job_metrics(store)]
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return ExitCode.SUCCESS
    sys.stdout.write(exposition(store.job_dir).decode())
    return ExitCode.SUCCESS
