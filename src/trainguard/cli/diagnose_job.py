"""`trainguard diagnose JOB_DIR`: what a job dir gives the diagnosis. I/O.

The job store names the attempts and their ranks' exits. The attempt diagnosed is the one
asked for, else the last that failed (a rank failed, the controller confirmed a hang, or a
node was lost), else the last. An attempt a node loss ended blames the lost node (what
its logs say is a consequence: diagnosis.lost). Its rank logs are scanned
(diagnosis.sources); when none of its ranks failed but the controller confirmed a hang,
that verdict (stacks/hang.json, with every rank's stack dump) is the diagnosis.
"""

from __future__ import annotations

import json
from pathlib import Path

from trainguard.controller.store import JobStore, db_path
from trainguard.controller.store_rows import log_dir_of
from trainguard.diagnosis.hung import hang_diagnosis
from trainguard.diagnosis.lines import file_rank
from trainguard.diagnosis.lost import lost_node
from trainguard.diagnosis.sources import JobInputs, JobReader, log_files
from trainguard.diagnosis.taxonomy import Diagnosis
from trainguard.diagnosis.verdict import RankExit
from trainguard.paths import HANG_FILE, STACKS_DIR, attempt_log_dir, stacks_dir
from trainguard.records import FaultScenario, RunningRecord
from trainguard.states import WorkerState


def job_reader(attempt: int | None) -> JobReader:
    """diagnosis.sources.diagnose_paths' reader of job dirs: `attempt`, or (None) the last
    that failed."""
    return lambda path, problems: read_job_dir(path, problems, attempt)


def read_job_dir(job_dir: Path, problems: list[str], attempt: int | None = None
                 ) -> JobInputs | None:
    """The attempt to diagnose, its log files, its ranks' exits and, when no rank failed
    but the launcher confirmed a hang, that hang's diagnosis. None: not a job dir."""
    if not db_path(job_dir).is_file():
        return None
    with JobStore.open(job_dir) as store:
        meta = store.meta()
        rows = store.all_workers()
        records = store.running_records()
    attempts = sorted({r.attempt for r in rows})
    log_dir = log_dir_of(meta, job_dir)
    losses = _node_losses(records)
    # every rank exited 0: a hang confirmed as the ranks were ending is no failure
    ok = {a for a in attempts if all(r.state == WorkerState.SUCCEEDED
                                     for r in rows if r.attempt == a)}
    failed = sorted({r.attempt for r in rows if r.state == WorkerState.FAILED}
                    | {a for a in attempts if a not in ok
                       and (stacks_dir(log_dir, a) / HANG_FILE).is_file()}
                    | set(losses))
    if attempt is None:
        attempt = failed[-1] if failed else (attempts[-1] if attempts else 0)
    adir = attempt_log_dir(log_dir, attempt)
    files = [(p, str(p.relative_to(job_dir)) if p.is_relative_to(job_dir) else str(p))
             for p in (log_files(adir) if adir.is_dir() else [])
             if STACKS_DIR not in p.relative_to(adir).parts]  # stack dumps are not logs
    if not files:
        problems.append(f"{adir}: no logs of attempt {attempt} (known attempts: "
                        f"{', '.join(map(str, attempts)) or 'none'})")
    exits = [RankExit(r.rank, r.state == WorkerState.FAILED, r.exit_code, r.ended_at,
                      r.oom_killed, r.node)
             for r in rows if r.attempt == attempt]
    if attempt in losses:
        node, reason = losses[attempt]
        ranks = sorted(r.rank for r in rows if r.attempt == attempt and r.node == node)
        return JobInputs(attempt, files, exits, None, lost=(node, reason, ranks))
    hung = None if any(e.failed for e in exits) else _hang_report(job_dir, log_dir, attempt)
    return JobInputs(attempt, files, exits, hung)


def _node_losses(records: list[RunningRecord]) -> dict[int, tuple[str, str]]:
    """attempt -> (the node lost, the controller's reason), for attempts a node loss ended."""
    out: dict[int, tuple[str, str]] = {}
    for rec in records:
        for rr in rec.recover_records:
            node = lost_node(rr.related_task)
            if rr.fault_scenario == FaultScenario.NODE_FAULT and node is not None:
                out.setdefault(rec.attempt, (node, rr.reason))
    return out


def _hang_report(job_dir: Path, log_dir: Path, attempt: int) -> Diagnosis | None:
    """The launcher's hang verdict of `attempt`, with its stack dumps, if it hung."""
    path = stacks_dir(log_dir, attempt) / HANG_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("cleared_at"):
        return None  # the job made progress again after that hang
    texts = {}
    for f in sorted(path.parent.glob("rank-*.txt")):
        rank = file_rank(f.name)
        if rank is not None:
            name = str(f.relative_to(job_dir)) if f.is_relative_to(job_dir) else str(f)
            texts[rank] = (name, f.read_text(encoding="utf-8", errors="replace"))
    return hang_diagnosis(data, texts)
