"""The read commands: `trainguard events|recovery|status JOB_DIR [--json]`.

They only read the job store, so they work while the job runs and after it ends.
Exit codes (ExitCode): 0 done, 2 no readable job at JOB_DIR (or `events --attempt N` of an
attempt the job does not have), 3 the job was lost while followed (`events --follow`: its
launcher died), 130 interrupted (`events --follow`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from trainguard.cli.args import count, job_dir_of, not_in_job, one_of, one_or_more_of
from trainguard.cli.fmt import (
    clock,
    complain,
    console_out,
    dash,
    involved_text,
    plural,
    print_json,
    print_table,
)
from trainguard.cli.status import print_status
from trainguard.controller.shown import shown_state
from trainguard.controller.store import JobStore
from trainguard.errors import StoreError
from trainguard.exitcodes import ExitCode
from trainguard.goodput import Goodput, job_goodput
from trainguard.paths import DEFAULT_RUNS_DIR
from trainguard.records import (
    Event,
    Level,
    Reason,
    RecoverRecord,
    RunningRecord,
    StartType,
    incidents_of,
    recoveries_by_rung,
    recoveries_text,
    secs,
)
from trainguard.states import JOB_ENDED, JobState

POLL_INTERVAL_S = 0.5
REASON_WIDTH = 19  # `events --follow` columns: most reasons and involved texts fit
INVOLVED_WIDTH = 33

_LEVEL_STYLES = {"Info": "cyan", "Warning": "yellow", "Error": "bold red"}
_Handler = Callable[[JobStore, argparse.Namespace], int]


def add_read_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `events`, `recovery` and `status`; each sets `func(args) -> exit code`."""
    events = _add(subparsers, "events", "show the job's events, oldest first", cmd_events)
    events.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="keep printing new events until the job has finished (Ctrl-C stops); "
        "with --json, prints one JSON object per line (JSON Lines) instead of an array",
    )
    events.add_argument("--level", type=one_of([lv.value for lv in Level]), metavar="LEVEL",
                        help="only events of this level or worse (Info < Warning < Error; "
                        "any case)")
    events.add_argument("--reason", action="append", metavar="REASON",
                        type=one_or_more_of([r.value for r in Reason]),
                        help="only events with this reason (e.g. WorkerFailed, any case); "
                        "repeatable, or comma-separated")
    events.add_argument("--attempt", type=int, help="only events of this attempt (one the "
                        "job has; with --follow, also one still to come)")
    events.add_argument("--tail", type=count, metavar="N",
                        help="only the last N events (with --follow: then the new ones)")
    _add(subparsers, "recovery", "show running records, recover records and goodput", cmd_recovery)
    _add(subparsers, "status", "show the job's state, its nodes and its ranks", cmd_status)


def add_job_dir(parser: argparse.ArgumentParser, *, newest_by_default: bool = True) -> None:
    """The JOB_DIR argument every command about one job takes (cli/args.job_dir_of): a job
    dir, or a run id of a job under ./trainguard-runs; left out, the job there that changed
    last, unless the command acts on the job (`stop`: `newest_by_default=False`)."""
    command = parser.prog.split(" ", 1)[-1]
    what = "the job dir printed by `trainguard run`, or its run id (a job under " \
        f"./{DEFAULT_RUNS_DIR})"
    if newest_by_default:
        parser.add_argument("job_dir", metavar="JOB_DIR", nargs="?", default="",
                            type=job_dir_of(command),
                            help=f"{what}; default: the job there that changed last")
    else:
        parser.add_argument("job_dir", metavar="JOB_DIR", type=job_dir_of(command), help=what)


def _add(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    help_text: str,
    handler: Callable[[argparse.Namespace], int],
) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(name, help=help_text, description=help_text + ".")
    add_job_dir(parser)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(func=handler)
    return parser


def cmd_events(args: argparse.Namespace) -> int:
    body = _follow_events if getattr(args, "follow", False) else _print_events
    return with_store("events", args, body)


def cmd_recovery(args: argparse.Namespace) -> int:
    return with_store("recovery", args, _print_recovery)


def cmd_status(args: argparse.Namespace) -> int:
    return with_store("status", args, print_status)


def with_store(command: str, args: argparse.Namespace, body: _Handler) -> int:
    """Open the store read-only, run `body`; a StoreError becomes one line and exit code 2."""
    try:
        with JobStore.open(Path(args.job_dir)) as store:
            return body(store, args)
    except StoreError as e:
        complain(command, str(e))
        return ExitCode.NO_JOB


# -- events -------------------------------------------------------------------


_LEVEL_ORDER = {Level.INFO.value: 0, Level.WARNING.value: 1, Level.ERROR.value: 2}


def event_filter(args: argparse.Namespace) -> Callable[[Event], bool]:
    """The --level/--reason/--attempt filters of `events`."""
    level = _LEVEL_ORDER.get(getattr(args, "level", None) or "", 0)
    reasons = {r for group in getattr(args, "reason", None) or [] for r in group}
    attempt = getattr(args, "attempt", None)

    def keep(ev: Event) -> bool:
        return (_LEVEL_ORDER.get(ev.level.value, 0) >= level
                and (not reasons or ev.reason in reasons)
                and (attempt is None or ev.involved.attempt == attempt))

    return keep


def _tail(items: list[Any], args: argparse.Namespace) -> list[Any]:
    n = getattr(args, "tail", None)
    return items if n is None else items[-n:] if n > 0 else []


def _no_such_attempt(store: JobStore, args: argparse.Namespace) -> bool:
    """`--attempt N` of an attempt the job does not have (yet: --follow waits for it): say
    which it has, as `logs --attempt` does."""
    attempt = getattr(args, "attempt", None)
    if attempt is None:
        return False
    have = [rec.attempt for rec in store.running_records()]
    to_come = getattr(args, "follow", False) and not job_finished(store.meta())
    if attempt in have or (to_come and attempt > max(have, default=-1)):
        return False
    complain("events", not_in_job("attempt", attempt, have, "--attempt"))
    return True


def _print_events(store: JobStore, args: argparse.Namespace) -> int:
    if _no_such_attempt(store, args):
        return ExitCode.USAGE
    keep = event_filter(args)
    # in time order: an event a takeover recorded for a message kept while no controller
    # watched (a checkpoint committed meanwhile) keeps its own, earlier time (walk-through
    # 42 #9: listed after the ControllerRestarted that came later); sorted is stable
    events = _tail(sorted((ev for _, ev in store.events() if keep(ev)), key=lambda e: e.time),
                   args)
    if args.json:
        print_json([ev.to_dict() for ev in events])
        return ExitCode.SUCCESS
    table = Table(box=None, pad_edge=False)
    for name in ("TIME", "LEVEL", "REASON"):
        table.add_column(name, no_wrap=True)
    table.add_column("INVOLVED", min_width=10)
    table.add_column("MESSAGE", min_width=24)
    for ev in events:
        table.add_row(
            clock(ev.time),
            Text(ev.level.value, style=_LEVEL_STYLES.get(ev.level.value, "")),
            Text(ev.reason),
            Text(involved_text(ev.involved)),
            Text(ev.message),
        )
    print_table(table)
    return ExitCode.SUCCESS


def _follow_events(store: JobStore, args: argparse.Namespace) -> int:
    """Print events as they come; stop once a poll after the job finished finds nothing new."""
    if _no_such_attempt(store, args):
        return ExitCode.USAGE
    console = console_out()
    keep = event_filter(args)
    last_id = 0
    finished_before = False
    first = True
    if not args.json:  # the header `events` prints, in the same fixed columns
        console.print(Text.assemble(
            (f"{'TIME':<12}", "bold"), "  ", (f"{'LEVEL':<7}", "bold"), "  ",
            (f"{'REASON':<{REASON_WIDTH}}", "bold"), "  ",
            (f"{'INVOLVED':<{INVOLVED_WIDTH}}", "bold"), "  ", ("MESSAGE", "bold")))
    try:
        while True:
            finished = job_finished(store.meta())
            new = store.events(last_id)
            last_id = new[-1][0] if new else last_id
            shown = [ev for _, ev in new if keep(ev)]
            for ev in _tail(shown, args) if first else shown:
                _emit_event_line(console, ev, as_json=args.json)
            first = False
            if finished_before and not new:
                return follow_ended(store.meta(), str(store.job_dir), "events")
            finished_before = finished
            time.sleep(POLL_INTERVAL_S)
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED


def _emit_event_line(console: Console, ev: Event, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(json.dumps(ev.to_dict()) + "\n")
        sys.stdout.flush()
        return
    line = Text.assemble(
        (clock(ev.time), "dim"),
        "  ",
        (f"{ev.level.value:<7}", _LEVEL_STYLES.get(ev.level.value, "")),
        "  ",
        (f"{ev.reason:<{REASON_WIDTH}}", "bold"),
        "  ",
        (f"{involved_text(ev.involved):<{INVOLVED_WIDTH}}", "dim"),
        "  ",
        ev.message,
    )
    console.print(line)




def follow_ended(meta: dict[str, Any] | None, job_dir: str, cmd: str) -> int:
    """How a follow ends: 0, or JOB_LOST with a note when the job's launcher died while it
    was followed (it ended as silently as a job that succeeded: walk-through 30)."""
    if meta is None or shown_state(meta) != JobState.LOST.value:
        return ExitCode.SUCCESS
    complain(cmd, f"the job's launcher (pid {meta.get('launcher_pid')}) is gone: the job is "
             "lost (killed, or its machine went down: nothing recorded its end). Fix: "
             f"`trainguard status {job_dir}` says what still runs; run the same `trainguard "
             "run` command again to continue it", "note")
    return ExitCode.JOB_LOST


def job_finished(meta: dict[str, Any]) -> bool:
    """Whether the job has ended (or its launcher is gone: shown as lost)."""
    return shown_state(meta) in JOB_ENDED


# -- recovery -----------------------------------------------------------------


def _print_recovery(store: JobStore, args: argparse.Namespace) -> int:
    meta = store.meta()
    records = store.running_records()
    summary = summarize(records, job_goodput(store))
    if args.json:
        print_json(
            {
                "run_id": meta.get("run_id"),
                "state": shown_state(meta),
                "running_records": [r.to_dict() for r in records],
                "summary": summary,
            }
        )
        return ExitCode.SUCCESS
    console = console_out()
    state = shown_state(meta) or "unknown"
    console.print(Text(f"run {meta.get('run_id')} · {state}", "bold"))
    for rec in records:
        console.print(_attempt_line(rec, state))
        for rr in rec.recover_records:
            console.print(_recover_lines(rr))
    console.print(Text(_summary_line(summary), "bold"))
    return ExitCode.SUCCESS


def summarize(records: list[RunningRecord], g: Goodput) -> dict[str, Any]:
    """Attempts, restarts, incidents, steps lost and the goodput ledger's figures (the
    definition: docs/goodput.md)."""
    incidents = incidents_of(records)  # one per fault
    by_rung = recoveries_by_rung(records)
    return {
        "attempts": len(records),
        "restarts": sum(by_rung.values()),  # every rung, as status
        "restarts_by_rung": by_rung,
        "launches": sum(1 for r in records
                        if r.start_type in (StartType.FIRST_START, StartType.RELAUNCH)),
        "incidents": len(incidents),
        "steps_lost": sum(rr.steps_lost or 0 for rr in incidents),  # where known:
        "steps_lost_unknown": sum(rr.steps_lost is None for rr in incidents),  # no step to
        # count from (none reported, or no recovery: a job that failed for good)
        # every step a later attempt did again: incidents' and relaunches' (report's count)
        "steps_done_again": g.steps_wasted,
        "wall_s": round(g.wall_s, 3),
        "productive_s": round(g.productive_s, 3),
        "badput_s": g.badput_s(),
        "goodput": g.ratio(),
    }


def _attempt_line(rec: RunningRecord, state: str) -> Text:
    """An attempt that has not ended reads `running`, or `lost` when its launcher is gone."""
    unended = "lost (its launcher died)" if state == JobState.LOST.value else "running"
    end = unended if rec.end_at is None else _wall(rec.end_at, since=rec.start_at)
    ended = "" if rec.end_reason is None else f"  ended: {rec.end_reason}"
    related = "" if rec.end_related_task is None else f" ({rec.end_related_task})"
    head = f"attempt {rec.attempt}  {rec.start_type.value:<21}"
    return Text(f"{head} {_wall(rec.start_at)} → {end}{ended}{related}")


def _recover_lines(rr: RecoverRecord) -> Text:
    """`↳ scenario · recovery · result · reason (related)` over the time split, steps lost."""
    split = "  ".join(f"{phase} {secs(v, '-')}" for phase, v in rr.durations().items())
    return Text.assemble(
        "  ↳ ",
        (f"{rr.fault_scenario.value} · {rr.recover} · {rr.recover_result.value}", "bold"),
        f" · {rr.reason} (related: {rr.related_task})\n",
        (f"    {split}  steps lost {dash(rr.steps_lost)}", "dim"),
    )


def _summary_line(s: dict[str, Any]) -> str:
    goodput = "unknown" if s["goodput"] is None else f"{s['goodput'] * 100:.1f}%"
    lost = "  ".join(f"{cause} {v:.3f}s" for cause, v in s["badput_s"].items() if v > 0)
    return (
        f"summary: {plural(s['attempts'], 'attempt')}, "
        f"{recoveries_text(s['restarts_by_rung'])}, "
        f"{plural(s['incidents'], 'incident')}, steps lost in incidents {s['steps_lost']}"
        + (f" (unknown in {s['steps_lost_unknown']})"
           if s["steps_lost_unknown"] else "") + ", "
        f"steps done again {s['steps_done_again']}, goodput {goodput} "
        f"(productive {s['productive_s']:.3f}s of {s['wall_s']:.3f}s)\n"
        f"  lost: {lost or 'nothing'}  (trainguard report JOB_DIR explains; docs/goodput.md)"
    )


def _wall(t: datetime, since: datetime | None = None) -> str:
    """Local date and clock; the date is left out when it is that of `since`."""
    day = t.astimezone().strftime("%Y-%m-%d ")
    same_day = since is not None and since.astimezone().strftime("%Y-%m-%d ") == day
    return clock(t) if same_day else day + clock(t)
