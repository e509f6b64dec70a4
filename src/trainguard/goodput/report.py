"""`trainguard report`: goodput and where the rest went, each incident, and advice. Pure
over what `gather` reads from the store."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from trainguard.controller.hang_evidence import woken_text
from trainguard.controller.shown import shown_state
from trainguard.controller.store import JobStore, NodeRow
from trainguard.exitcodes import ExitCode
from trainguard.goodput.interval import IntervalAdvice
from trainguard.goodput.ledger import CAUSES, STOPPED, Goodput
from trainguard.goodput.metrics import interval_advice
from trainguard.goodput.read import Save, job_goodput, saves
from trainguard.records import (
    NO_RECOVERY,
    Event,
    FaultScenario,
    Reason,
    RecoverRecord,
    RecoverResult,
    RunningRecord,
    incidents_of,
    plural,
    recoveries_by_rung,
    recoveries_text,
    secs,
)

_REASONS = (Reason.FAILURE_DIAGNOSED.value, Reason.HANG_CONFIRMED.value,
            Reason.HANG_SUSPECTED.value, Reason.HANG_RESTART_LIMIT_REACHED.value,
            Reason.NO_PROGRESS.value)


@dataclass
class ReportInput:
    meta: dict[str, Any]
    records: list[RunningRecord]
    events: list[Event]
    nodes: list[NodeRow]
    goodput: Goodput
    commits: list[Save]


def gather(store: JobStore, now: datetime | None = None) -> ReportInput:
    commits, meta, records = saves(store), store.meta(), store.running_records()
    return ReportInput(meta, records, [ev for _, ev in store.events(reasons=_REASONS)],
                       store.nodes(), job_goodput(store, now, commits, meta, records), commits)


def _culprit(confirmed: dict[str, Any], recover: str) -> str | None:
    """A hang's culprit as its HangConfirmed said, its stopped processes' wake-up command
    dropped once a rung replaced them."""
    reason = (confirmed.get("culprit") or {}).get("reason") if confirmed else None
    if not isinstance(reason, str):
        return None
    return reason if recover == NO_RECOVERY else woken_text(reason)


def report_doc(r: ReportInput) -> dict[str, Any]:
    """The `report --json` document."""
    g = r.goodput
    diagnoses = [ev for ev in r.events if ev.reason == Reason.FAILURE_DIAGNOSED.value]
    hangs = [ev for ev in r.events if ev.reason == Reason.HANG_CONFIRMED.value]
    incidents = []
    every = incidents_of(r.records)  # one per fault (a rung's downgrade is the next's)
    hung = [rr.fault_scenario == FaultScenario.JOB_HANGED for rr in every]
    own_d = own_events(every, diagnoses, [not h for h in hung])
    own_h = own_events(every, hangs, hung)
    for rr, d, h in zip(every, own_d, own_h, strict=True):
        evidence = d.get("evidence") if isinstance(d.get("evidence"), dict) else None
        incidents.append({
            "attempt": rr.attempt, "fault_scenario": rr.fault_scenario.value,
            "recover": rr.recover, "result": rr.recover_result.value,
            "reason": rr.reason, "related_task": rr.related_task,
            "category": rr.category or d.get("category"),
            "deciding_line": None if evidence is None else
            f"{evidence.get('file')}:{evidence.get('line')}: {evidence.get('text')}",
            "hang_culprit": _culprit(h, rr.recover),
            "durations_s": rr.durations(), "steps_lost": rr.steps_lost,
            "resumed_from": rr.resumed_from})
    advice = interval_advice(g, r.records, r.commits)
    by_rung = recoveries_by_rung(r.records)
    return {"run_id": r.meta.get("run_id"), "state": shown_state(r.meta),
            "attempts": len(r.records),
            "restarts": sum(by_rung.values()), "restarts_by_rung": by_rung,
            "goodput": g.to_dict(max_steps=0) | {"segments": None},
            "incidents": incidents, "checkpoint_interval": advice.to_dict(),
            "advice": advice_lines(r, advice)}


_STORAGE = "disk_full_or_storage_io"
_SLACK = timedelta(seconds=1)  # the ranks' exit times are the agents' clocks


def own_events(incidents: list[RecoverRecord], events: list[Event],
               wanted: list[bool]) -> list[dict[str, Any]]:
    """Each incident's own event's data ({} for one not `wanted`, or with none): of its
    attempt, the first not taken by an earlier incident, written from its fault on (less a
    second: the agents' clocks) and before the next incident's fault. With in-process rungs
    one attempt holds many incidents, and each had been given the attempt's last diagnosis or
    hang (walk-through 37 #1); a hang's HangConfirmed is written after its stacks are taken,
    past its decision (review 43 #7); two incidents may come within a second (review 43 #2)."""
    out: list[dict[str, Any]] = []
    taken: set[int] = set()
    for i, rr in enumerate(incidents):
        after = next((o for o in incidents[i + 1:] if o.attempt == rr.attempt), None)
        start = (rr.fault_at or rr.recover_start_at) - _SLACK
        until = None if after is None else after.fault_at or after.recover_start_at
        mine = [k for k, ev in enumerate(events) if k not in taken and wanted[i]
                and ev.involved.attempt == rr.attempt and start <= ev.time
                and (until is None or ev.time < until)]
        k = min(mine, key=lambda k: events[k].time, default=None)
        if k is not None:
            taken.add(k)
        out.append({} if k is None else events[k].data or {})
    return out


def _hang_advice(r: ReportInput) -> list[str]:
    """Hangs that took over 5% of the run, one of them not restarted: why (the flag off: left
    running; or its limit spent, a HangRestartLimitReached in its attempt: the job gave up)
    and what to do."""
    g = r.goodput
    hung = g.seconds("hang")
    left = {rr.attempt for rec in r.records for rr in rec.recover_records
            if rr.recover == NO_RECOVERY and rr.fault_scenario == FaultScenario.JOB_HANGED}
    if not left or hung <= 0.05 * max(g.wall_s, 1e-9):
        return []
    spent = {ev.involved.attempt for ev in r.events
             if ev.reason == Reason.HANG_RESTART_LIMIT_REACHED.value}
    head = f"hangs: {hung:.0f}s ({hung / max(g.wall_s, 1e-9):.0%} of the run) went to hangs"
    if left <= spent:  # walk-through 24: told to turn on the --restart-on-hang it had
        limits = r.meta.get("budgets")
        budget = limits.get("max_hang_restarts") if isinstance(limits, dict) else None
        return [f"{head}; the job gave up on the last one, its ranks stopped: "
                f"{budget if budget is not None else 'the'} restarts upon suspension in a row "
                "made no progress (HangRestartLimitReached; a fixed limit, not a flag): find "
                "why the ranks hang (`trainguard diagnose JOB_DIR` names the culprit) and fix "
                "it before running the job again"]
    return [f"{head}, a confirmed one left running; with --restart-on-hang the ranks are "
            "restarted in place once a hang is confirmed (outside the restart budget)"]


def advice_lines(r: ReportInput, a: IntervalAdvice) -> list[str]:
    out: list[str] = []
    g = r.goodput
    if r.meta.get("exit_code") == ExitCode.NO_PROGRESS:
        ends = [ev.reason for ev in r.events if ev.reason in (
            Reason.HANG_RESTART_LIMIT_REACHED.value, Reason.NO_PROGRESS.value)]
        hang_budget = bool(ends) and ends[-1] == Reason.HANG_RESTART_LIMIT_REACHED.value
        why = ("restarts upon suspension kept hanging without progress "
               "(HangRestartLimitReached)" if hang_budget else
               "attempts kept failing without progress (NoProgress)")
        out.append(f"the job ended with exit {int(ExitCode.NO_PROGRESS)}: {why}; do not requeue "
                   "it as it is: `trainguard diagnose JOB_DIR` names the cause to fix first")
    incidents = incidents_of(r.records)
    if incidents and all(rr.category == _STORAGE for rr in incidents):  # walk-through 24: a full
        # disk's failed saves were the failures, and saving more often was the advice
        out.append(f"checkpoints: every failure was the storage's ({_STORAGE}: `trainguard "
                   "diagnose JOB_DIR` names the path): free or fix it; no interval advice "
                   "from failures that saving caused")
    elif a.optimal_s is not None and a.current_s is not None and incidents and all(
            rr.steps_lost == 0 for rr in incidents):  # walk-through 40 #4: advised to save
        # 10x as often, from failures that lost nothing (memory snapshots, saves on exit)
        out.append(
            f"checkpoints: every {a.current_s:.1f}s now; no failure lost a step (each resumed "
            "from a memory snapshot or a save on the way out), so the interval cost nothing "
            "here: it bounds the loss only where those fail (a node lost with its memory, a "
            f"kill with no time to save); Young/Daly's {a.optimal_s:.1f}s for the observed MTBF "
            f"{a.mtbf_s:.0f}s{a.rough()} assumes every failure falls back to the last "
            "checkpoint")
    elif a.optimal_s is not None and a.current_s is not None and a.loss_now is not None \
            and a.loss_optimal is not None:
        verb = "about right" if 0.67 <= a.current_s / a.optimal_s <= 1.5 else (
            "too often" if a.current_s < a.optimal_s else "too rarely")
        out.append(
            f"checkpoints: every {a.current_s:.1f}s now ({verb}); with the observed MTBF "
            f"{a.mtbf_s:.0f}s and {a.blocking_s:.3f}s blocking per save the optimal interval "
            f"(Young/Daly) is {a.optimal_s:.1f}s: expected loss {a.loss_now:.1%} -> "
            f"{a.loss_optimal:.1%} of the run{a.rough()}")
    elif a.mtbf_s is None:
        out.append("checkpoints: no failure yet, so no MTBF to size the interval by")
    elif a.current_s is None:
        saved = len(r.commits)
        out.append("checkpoints: " + (
            "no checkpoint saved yet (none recorded through trainguard.checkpoint's "
            "Checkpointer): interval advice needs two saves in one attempt's training loop"
            if not saved else
            f"{plural(saved, 'save')} recorded; interval advice needs two saves in one "
            "attempt's training loop with no failure between them"))
    suspected = [ev.data or {} for ev in r.events if ev.reason == Reason.HANG_SUSPECTED.value]
    ideal = g.ideal_step_s()
    if suspected and ideal:
        thr = suspected[-1].get("threshold_s")
        if isinstance(thr, int | float):
            out.append(f"hang detection: threshold {thr:g}s against a {ideal:.3f}s step "
                       f"({thr / ideal:.0f}x); a hang costs at least that before it is confirmed")
    out += _hang_advice(r)
    wasted = g.seconds("wasted_progress")
    if wasted > 0.05 * max(g.wall_s, 1e-9):
        if g.steps_wasted:
            out.append(f"wasted progress: {wasted:.1f}s of work thrown away by failures "
                       f"({plural(g.steps_wasted, 'step')} done again, and the steps cut short "
                       "by a crash); checkpoint more often or use memory snapshots "
                       "(--memory-every)")
        else:  # no step was done twice: only the step a crash cut short, which no save keeps
            out.append(f"wasted progress: {wasted:.1f}s of a step a crash cut short (no step "
                       "was done again)")
    implicated = [n for n in r.nodes if n.times_implicated]
    if implicated:
        out.append("nodes implicated: " + ", ".join(
            f"{n.name} ({n.times_implicated}x, {n.state.value})" for n in implicated))
    return out


def render(doc: dict[str, Any]) -> str:
    """One page of text."""
    g = doc["goodput"]
    ratio = "unknown" if g["goodput"] is None else f"{g['goodput']:.1%}"
    lines = [f"run {doc['run_id']} · {doc['state']} · {doc['attempts']} attempt(s), "
             f"{recoveries_text(doc['restarts_by_rung'])} · wall {g['wall_s']:.1f}s",
             f"goodput {ratio}: productive {g['productive_s']:.1f}s; steps done once "
             f"{g['steps']['productive']}, done again {g['steps']['wasted']}"
             + ("" if g["measured_steps"] else " (no step reports: time between a restart's "
                "first output and the next fault counts as productive)" if g["output_counts"]
                else " (no step reported yet: start-up until the first, or until the job is "
                "known to report none)"),
             "", "where the rest went:"]
    wall = max(g["wall_s"], 1e-9)
    for cause in sorted(CAUSES, key=lambda c: -g["badput_s"][c]):
        s = g["badput_s"][cause]
        if s > 0:
            lines.append(f"  {cause:<20} {s:9.3f}s {s / wall:6.1%}  {'#' * round(40 * s / wall)}")
    if g.get("stopped_s"):  # (walk-through 42 #2: it read as `queued`, goodput near 0)
        lines.append(f"  {STOPPED:<20} {g['stopped_s']:9.3f}s {g['stopped_s'] / wall:6.1%}  "
                     "stopped on purpose until launched again: not counted in the goodput")
    if doc["incidents"]:
        lines += ["", "incidents:"]
    for i in doc["incidents"]:
        d = i["durations_s"]
        lines.append(f"  attempt {i['attempt']}: {i['fault_scenario']} -> {i['recover']} -> "
                     f"{i['result']} ({i['related_task']}): {i['reason']}")
        lost = "-" if i["steps_lost"] is None else i["steps_lost"]
        if i["recover"] == NO_RECOVERY:  # nothing acted: no recovery to time
            lines.append(f"    not recovered: detected in {secs(d['detect'], '-')}; no rung "
                         "of the ladder acted")
        elif i["result"] in (RecoverResult.FAILED.value, RecoverResult.TERMINATED.value):
            lines.append(f"    not recovered ({i['result']}): detected in "
                         f"{secs(d['detect'], '-')}, stopped in {secs(d['stop'], '-')}; steps "
                         f"lost {lost}")
        else:
            lines.append(f"    recovered in {secs(d['total'], '-')} (detect "
                         f"{secs(d['detect'], '-')}, stop {secs(d['stop'], '-')}, start "
                         f"{secs(d['start'], '-')}, resume {secs(d['resume'], '-')}); steps "
                         f"lost {lost}"
                         + (f"; from {i['resumed_from']}" if i["resumed_from"] else ""))
        if i["deciding_line"]:
            lines.append(f"    {i['category']}: {i['deciding_line']}")
        if i["hang_culprit"]:
            lines.append(f"    hang: {i['hang_culprit']}")
    lines += ["", "advice:"] + [f"  - {a}" for a in doc["advice"] or ["none"]]
    return "\n".join(lines)
