"""From findings and exits to one verdict: the root cause of a failed attempt. Pure.

Every finding becomes a candidate with a role (taxonomy.Role; candidates.py). The
strongest role present decides which candidates compete; among those the earliest wins: by
time when both have one, by position when both come from one file, else by the rules' order.
A rank's exit by signal competes with the weak role (a SIGKILL with nothing in the log is
as telling as an abort line). Everything else the attempt printed becomes the symptoms the
root explains.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime

from trainguard.diagnosis.candidates import (
    PLAIN_EXIT_ADVICE,
    TIER,
    Candidate,
    RankExit,
    ended_how,
    from_exit,
    from_finding,
    plain_exit,
    rank_of,
    signal_of,
)
from trainguard.diagnosis.explained import explained_abort
from trainguard.diagnosis.fallback import refine
from trainguard.diagnosis.findings import Finding
from trainguard.diagnosis.ranks import rank_taken_twice, split_announcements
from trainguard.diagnosis.restart import story_restart
from trainguard.diagnosis.rules import RuleSet
from trainguard.diagnosis.stopped_first import ended_first
from trainguard.diagnosis.survived import not_survived
from trainguard.diagnosis.taxonomy import (
    Category,
    Culprit,
    Diagnosis,
    Evidence,
    FaultDomain,
    RestartHelps,
    Role,
)

_SIGABRT = 6
_MAX_SYMPTOMS = 10
# what NCCL's generic system or internal error gives way to when its WARN names it
_NCCL_WARN_CAUSES = (Category.SHARED_MEMORY, Category.GPU_OOM)
# an abort line (a shell's or srun's `Aborted (core dumped)`, SIGABRT), not a segfault
_ABORT_LINE = re.compile(r"\bAborted\b|\bSIGABRT\b|signal 6\b")
# where Python reports a SyntaxError (no "Traceback" header, no ", in f"): the scanner keeps
# it among a log's last lines (context findings), a few lines above the exception
_COMPILE_SITE = re.compile(r'^File "([^"]+)", line (\d+)$')
# TensorFlow's exception that gathers the errors of its ops: the numbered lines below it
# (`  (0) Internal: ...`) name them
_ROOT_ERRORS = re.compile(r"\b\d+ root error\(s\) found\.?\s*$")


def _order(cands: list[Candidate]) -> list[Candidate]:
    """Earliest first: by time where known, by position within one file, else rule order."""
    timed = [c for c in cands if c.at is not None]
    untimed = [c for c in cands if c.at is None]
    timed.sort(key=lambda c: (c.at, c.finding.offset if c.finding else 0))
    files = {c.finding.file for c in untimed if c.finding is not None}
    if len(files) <= 1:
        untimed.sort(key=lambda c: (c.finding is None, c.finding.offset if c.finding else 0))
    else:
        untimed.sort(key=lambda c: (c.rule.priority if c.rule else 1000,
                                    c.finding.file if c.finding else "",
                                    c.finding.offset if c.finding else 0))
    return timed + untimed


def _pick(cands: list[Candidate]) -> Candidate:
    best = min(c.tier for c in cands)
    tier = [c for c in cands if c.tier == best]
    # an exception no rule knows, read as the user's, gives way to a later exception of its
    # own chain that a rule knows: the library's wrapper names what failed (an object
    # store's EndpointConnectionError over the ConnectionRefusedError under it; walk-through
    # 27 read a storage outage as the user's bug)
    known = {(c.finding.file, c.finding.chain) for c in tier if c.rule is not None
             and c.finding is not None and c.finding.chain is not None}
    # ... and TensorFlow's header over the errors it gathered (`InternalError: 2 root
    # error(s) found.`) to a line a rule knows among the numbered ones below it (`  (0)
    # Internal: Blas GEMM launch failed ...`): those are what failed
    listed = {(c.finding.file, c.finding.line) for c in tier if c.rule is not None
              and c.finding is not None}
    tier = [c for c in tier if not (
        c.rule is None and c.category == Category.USER_CODE_ERROR and c.finding is not None
        and ((c.finding.file, c.finding.chain) in known or (
            _ROOT_ERRORS.search(c.finding.text) is not None
            and any((c.finding.file, c.finding.line + n) in listed for n in (1, 2)))))] or tier
    if best == TIER[Role.SYMPTOM]:
        # symptoms only: the most specific kind (a launcher's summary is the least), then
        # the earliest
        def rank(c: Candidate) -> tuple[bool, int]:
            return (c.category == Category.OTHER, c.rule.priority if c.rule else 1000)
        top = min(rank(c) for c in tier)
        tier = [c for c in tier if rank(c) == top]
    root = _order(tier)[0]
    if root.rule is not None and root.rule.id == "nccl-internal-or-system":
        # NCCL's generic system or internal error: its WARN naming shared or device memory
        # or a socket's address family is the call that failed
        root = _order([c for c in tier if c.category in _NCCL_WARN_CAUSES or (
            c.rule is not None and c.rule.id == "socket-address-family")] or [root])[0]
    if root.category == Category.KILLED_BY_SIGNAL_UNKNOWN:
        # a stop that comes after a collective timeout is someone's answer to the hang
        hang = [c for c in cands if c.category == Category.NCCL_TIMEOUT_OR_HANG]
        first = _order([root, *hang])[0] if hang else root
        if first is not root:
            return first
    return root


def diagnose(findings: Sequence[Finding], exits: Sequence[RankExit], rules: RuleSet,
             detected_at: datetime | None = None, *, fallback: bool = True) -> Diagnosis | None:
    """The root cause across ranks, or None when nothing failed and nothing was found.

    `detected_at`: lines read after the launcher saw the failure are its consequences (the
    launcher stopping the survivors) and are left out. `fallback`: when the rules are
    silent or weak, ask the failure families and the learned model (diagnosis/fallback.py);
    either way the restart verdict is read from the whole story (diagnosis/restart.py).
    """
    seen = [f for f in findings if detected_at is None or f.at is None or f.at_inherited
            or f.at <= detected_at]
    seen = not_survived(seen, exits)  # caught and trained past, recovered in place
    seen, twice = split_announcements(seen)  # a rank's announcement decides only as a pair
    d, others = _rules_verdict(seen, exits, rules)
    d = explained_abort(d, seen, rules)  # an abort whose uncaught exception says why
    if fallback:
        d = refine(d, seen)
    d = rank_taken_twice(d, twice)
    d = ended_first(d, exits)  # peers failing after a rank ended its script or was stopped
    return None if d is None else story_restart(d, seen, others)


def _rules_verdict(seen: list[Finding], exits: Sequence[RankExit],
                   rules: RuleSet) -> tuple[Diagnosis | None, list[Category]]:
    """The rules' verdict, and the categories of the exceptions other candidates died of."""
    # a rank killed by a signal did not die of an exception line it printed without a
    # traceback (a warning such as "ImportError: no apex, using native")
    killed = {e.rank for e in exits if e.failed and signal_of(e.returncode) is not None}
    seen = [f.model_copy(update={"final": False})
            if f.final and not f.traceback and f.rank in killed else f for f in seen]
    seen = _compile_sites(seen)
    cands = [c for f in seen if (c := from_finding(f, rules)) is not None]
    exit_ranks = set()
    # ranks whose own lines (not an exit notice about them) say what went wrong
    explained = {c.rank for c in cands if c.tier <= TIER[Role.SYMPTOM]
                 and c.finding is not None and c.finding.returncode is None
                 and c.category != Category.OTHER}
    # an abort line of a rank whose collective timed out is the NCCL watchdog taking the
    # process down (as an abort's exit notice is, below): the timeout decides, the abort is
    # one of its symptoms
    told = {c.rank for c in cands if c.tier <= TIER[Role.SYMPTOM] and c.finding is not None
            and c.category == Category.NCCL_TIMEOUT_OR_HANG}
    cands = [replace(c, tier=TIER[Role.HINT]) if (
        c.category == Category.SEGFAULT_OR_ABORT and c.tier == TIER[Role.WEAK]
        and c.finding is not None and _ABORT_LINE.search(c.finding.text)
        and (c.rank in told or (c.rank is None and told))) else c for c in cands]
    for f in seen:
        if f.returncode is not None:
            rank = rank_of(f)
            if signal_of(f.returncode) == _SIGABRT and (rank in explained or (
                    rank is None and explained)):
                continue  # an abort the log explains (the NCCL watchdog, std::terminate)
            c = from_exit(rank, f.returncode, None, f.at, f)
            if c is not None:
                if c.category == Category.KILLED_BY_SIGNAL_UNKNOWN:  # the notice says who
                    cands = [x for x in cands if x.finding is not f or x.tier < c.tier]
                cands.append(c)
                exit_ranks.add(rank_of(f))
    for e in exits:
        if e.failed and not (signal_of(e.returncode) == _SIGABRT and e.rank in explained):
            # (an abort its own log explains: the NCCL watchdog, std::terminate, an assert)
            c = from_exit(e.rank, e.returncode, e.oom_killed, e.ended_at, None)
            if c is None and e.rank not in explained and e.returncode:
                c = plain_exit(e)
            if c is not None:
                cands = [x for x in cands if not (x.finding is not None and x.rank == e.rank
                                                  and x.finding.returncode is not None)]
                cands.append(replace(c, at=e.ended_at))
    if not cands:
        failed = [e for e in exits if e.failed]
        if not failed:
            return None, []
        first = min(failed, key=lambda e: (e.ended_at is None, e.ended_at or datetime.max))
        return Diagnosis(
            Category.OTHER, FaultDomain.USER_CODE, RestartHelps.NO,
            f"rank {first.rank} {ended_how(first.returncode)} and left no known error "
            "in its log", PLAIN_EXIT_ADVICE,
            Culprit(first.rank, first.node), confidence=0.2), []
    root = _pick(cands)
    others = [c for c in cands if c is not root]
    died_of = [c.category for c in others if c.finding is not None and c.finding.final
               and c.rank != root.rank]
    return _diagnosis(root, others, exits), died_of


def _compile_sites(seen: list[Finding]) -> list[Finding]:
    """An exception with no frame (a SyntaxError) gets the `File "x", line N` line printed
    up to 4 lines above it, when the log shows one."""
    sites = {(f.file, f.line): m for f in seen
             if f.context and (m := _COMPILE_SITE.match(f.text.strip())) is not None}
    if not sites:
        return seen
    out = []
    for f in seen:
        if f.exc_type is not None and f.frame is None and not f.context:
            m = next((sites[f.file, n] for n in range(f.line - 1, f.line - 5, -1)
                      if (f.file, n) in sites), None)
            if m is not None:
                f = f.model_copy(update={"frame": f"{m.group(1)}:{m.group(2)}"})
        out.append(f)
    return out


def _evidence(c: Candidate) -> Evidence | None:
    if c.finding is None:  # an exit without a line: say how the process ended
        return None if c.summary is None else Evidence("", 0, c.summary, c.rank, c.at)
    return replace(c.finding.evidence(), rank=c.rank)


def _copies(root: Candidate, others: list[Candidate]) -> set[int]:
    """The other ranks that printed the root cause's own line (the same failure on each
    rank, an OOM every rank hit): counted with the evidence, not listed as symptoms."""
    if root.finding is None:
        return set()
    return {c.rank for c in others if c.finding is not None and c.key == root.key
            and c.rank is not None and c.rank != root.rank}


def _symptoms(root: Candidate, others: list[Candidate],
              copies: set[int]) -> tuple[Evidence, ...]:
    """`copies`: the ranks whose copy of the root cause's line is counted with it."""
    groups: dict[str, list[Candidate]] = {}
    for c in _order(others):
        if c.tier == TIER[Role.HINT]:
            continue
        if c.rank in copies and c.finding is not None and c.key == root.key:
            continue  # the root cause again, on another rank
        if c.at is not None and root.at is not None and c.at < root.at:
            continue  # it came before the root cause: the root does not explain it
        groups.setdefault(c.key if c.finding is not None else f"exit-{c.rank}", []).append(c)
    out = []
    for members in groups.values():
        ranks = {m.rank for m in members if m.rank is not None}
        ev = _evidence(members[0])
        if ev is not None:
            out.append(replace(ev, count=max(len(ranks), 1)))
    return tuple(out[:_MAX_SYMPTOMS])


def _root_evidence(root: Candidate, copies: set[int]) -> Evidence | None:
    """The deciding line, with how many ranks printed it (`count`)."""
    ev = _evidence(root) if root.finding is not None else None
    return replace(ev, count=len(copies) + 1) if ev is not None and copies else ev


def _diagnosis(root: Candidate, others: list[Candidate],
               exits: Sequence[RankExit]) -> Diagnosis:
    node = root.finding.node if root.finding is not None else None
    if node is None and root.rank is not None:
        node = next((e.node for e in exits if e.rank == root.rank), None)
    who = f"rank {root.rank}: " if root.rank is not None else ""
    copies = _copies(root, others)
    if root.summary is not None:
        summary = root.summary
    elif root.finding is not None:
        summary = f"{who}{root.finding.text.strip()[:300]}"
    else:
        summary = f"{who}{root.category.value}"
    conf = root.confidence
    rivals = {c.category for c in others if c.tier == root.tier and c.rank != root.rank}
    if rivals - {root.category}:
        conf -= 0.1
    return Diagnosis(
        root.category, root.domain, root.restart, summary, _advice(root),
        Culprit(root.rank, node, root.finding.frame if root.finding else None,
                root.finding.library_frame if root.finding and root.finding.traceback
                else None),
        _root_evidence(root, copies), _symptoms(root, others, copies),
        root.isolate, round(max(conf, 0.05), 2),
        root.subcategory, root.rule.id if root.rule else None,
        from_log=root.finding is not None and root.finding.returncode is None)


_PATH = re.compile(r"""['"](/[^'"\s]+)['"]""")  # a quoted absolute path on the line


def _advice(root: Candidate) -> str:
    """The rule's advice; for a full disk, the path its line names (where to look first)."""
    if root.category != Category.DISK_FULL_OR_STORAGE_IO or root.finding is None:
        return root.advice
    m = _PATH.search(root.finding.text)
    if m is None:
        return root.advice
    where = m.group(1).rsplit("/", 1)[0] or "/"
    return f"{root.advice} The line names {m.group(1)}: `df -h {where}` shows its file system."
