"""The launcher's question: why did this attempt fail? Pure: worker facts -> Diagnosis.

Each node's agent has already scanned its ranks' logs (WorkerFact.findings); torch's
@record error file, when a rank wrote one, adds the exception it died of.
"""

from __future__ import annotations

from datetime import datetime, timezone

from trainguard.diagnosis.candidates import RankExit
from trainguard.diagnosis.findings import Finding
from trainguard.diagnosis.lines import EXCEPTION_LINE
from trainguard.diagnosis.lost import node_loss_diagnosis
from trainguard.diagnosis.rules import load_rules
from trainguard.diagnosis.taxonomy import Diagnosis
from trainguard.diagnosis.verdict import diagnose
from trainguard.protocol import WorkerFact
from trainguard.states import WorkerState


def error_file_finding(data: dict[str, object] | None, rank: int, name: str) -> Finding | None:
    """torch @record's error file ({"message": {"message", "extraInfo": {"timestamp"}}})
    as the final exception of `rank`; None when it holds no message."""
    msg = (data or {}).get("message")
    at = None
    if isinstance(msg, dict):
        extra = msg.get("extraInfo")
        ts = extra.get("timestamp") if isinstance(extra, dict) else None
        if isinstance(ts, (int, str)) and str(ts).isdigit():
            at = datetime.fromtimestamp(int(ts), timezone.utc)
        msg = msg.get("message")
    if not isinstance(msg, str) or not msg.strip():
        return None
    text = msg.strip().splitlines()[-1].strip()
    exc = EXCEPTION_LINE.match(text)
    rule = load_rules().match(text, is_exception=True)
    return Finding(file=name, line=1, offset=0, text=text[:2000], rank=rank, at=at,
                   rule=rule.id if rule else None,
                   exc_type=exc.group(1) if exc else "Exception", traceback=True, chain=1,
                   final=True)


def diagnose_attempt(facts: list[WorkerFact], detected_at: datetime | None = None,
                     node: str | None = None) -> Diagnosis | None:
    """The attempt's root cause, or None when no worker failed.

    Ranks the launcher stopped count too: a rank can print its error and still be tearing
    down when a peer's symptom ends the attempt. Lines read after `detected_at` (the
    launcher stopping everyone) are left out.
    """
    if not any(f.state == WorkerState.FAILED for f in facts):
        return None
    return diagnose(*_inputs(facts, node), load_rules(), detected_at)


def diagnose_node_loss(facts: list[WorkerFact], lost: str, why: str, ranks: list[int],
                       detected_at: datetime | None = None,
                       not_blamed: str | None = None) -> Diagnosis:
    """A node loss's verdict, as `trainguard diagnose JOB_DIR` gives it (diagnosis.lost):
    the lost node is the cause, what the other ranks' logs say (read up to `detected_at`)
    its symptoms. `ranks`: the lost node's; `why`: how the launcher lost it; `not_blamed`:
    why it is not at fault, when it is not drained."""
    return node_loss_diagnosis(lost, why, ranks,
                               diagnose(*_inputs(facts, None), load_rules(), detected_at),
                               not_blamed)


def _inputs(facts: list[WorkerFact], node: str | None) -> tuple[list[Finding], list[RankExit]]:
    """The verdict's inputs: the failed and stopped ranks' findings (with torch's error file
    when its exception is not in the log), and every ended rank's exit."""
    findings: list[Finding] = []
    exits = []
    for f in facts:
        if f.state == WorkerState.SUCCEEDED:  # a rank that ended first: early_exit reads it
            exits.append(RankExit(f.rank, False, f.returncode, f.ended_at, node=f.node or node))
        if f.state not in (WorkerState.FAILED, WorkerState.STOPPED):
            continue
        findings += f.findings
        from_file = error_file_finding(f.error_file, f.rank, f"rank-{f.rank}.error.json")
        if from_file is not None and not any(  # (the file names the class bare, the log
                g.final and (g.text == from_file.text  # with its module: `mod.Err: ...`)
                             or g.text.endswith("." + from_file.text)) for g in f.findings):
            # (the log's own line of that exception is the evidence: it has the frame and
            # the time to the microsecond; the file's whole-second stamp came first and the
            # live verdict said "no traceback in the log says where"; walk-through 28)
            findings.append(from_file)
        exits.append(RankExit(f.rank, f.state == WorkerState.FAILED, f.returncode, f.ended_at,
                              f.oom_killed, f.node or node, f.second_last_step_at,
                              stopped=f.state == WorkerState.STOPPED,
                              stopped_by=f.stopped_by.value if f.stopped_by else None))
    return findings, exits


def diagnosis_message(d: Diagnosis) -> str:
    """The FailureDiagnosed event's text: verdict, evidence location, advice."""
    parts = [f"{d.category.value}{d.library_note} ({d.fault_domain.value}, restart helps: "
             f"{d.restart_helps.value}{', isolate node' if d.isolate_node else ''}): "
             f"{d.summary.rstrip('.')}."]
    if d.evidence is not None:
        parts.append(f"Evidence: {d.evidence.where()}.")
    if d.symptoms:
        parts.append(f"Explains {len(d.symptoms)} symptom(s).")
    parts.append(d.advice)
    return " ".join(parts)
