"""What can be a failed attempt's root cause: a line a rule or an exception marks, a rank's
exit by signal or with a non-zero code. Each becomes a Candidate with a tier (its role's
strength: lower decides first), a category and a restart verdict; verdict.py picks among
them. Pure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from trainguard.diagnosis.findings import Finding
from trainguard.diagnosis.rules import Rule, RuleSet
from trainguard.diagnosis.taxonomy import Category, FaultDomain, RestartHelps, Role
from trainguard.exitcodes import signal_name

TIER = {Role.DECISIVE: 0, Role.CAUSE: 1, Role.WEAK: 2, Role.SYMPTOM: 3, Role.HINT: 4}
SIGNAL_TIER = 2

_RANK_IN_TEXT = re.compile(r"\[Rank (\d+)\]|\brank[ :=]\s?(\d+)\b|\[rank(\d+)\]")
_IGNORED_EXCEPTIONS = ("KeyboardInterrupt", "SystemExit", "BdbQuit")
# a Python warning as the warnings module prints it (`/x/torch/cuda/__init__.py:138:
# UserWarning: ...`): the process went on after it, so it names a cause only when no error
# does (both cases of the labelled sets that a warning decided died of a later error)
_PY_WARNING = re.compile(r"\.py:\d+: \w*Warning: ")
# a line logged at INFO level that names no failure (`[distributed_c10d.py][INFO] Rank 0:
# Completed store-based barrier ...`) reports what went well: it decides nothing (an INFO line
# that says `loss is nan`, `overflow`, `Connection refused` or NCCL's trace still does, as does
# a paste flattened onto one line that holds a traceback's header after its INFO stamp)
_INFO_LEVEL = re.compile(r"\[INFO\]|(?:^|[\s|:\]])INFO(?:[\s|:\[]|$)")
_FAILURE_WORD = re.compile(
    r"(?i)error|fail|fatal|abort|time[ds]?[ _]?out|refused|reset|unreachable|no route|killed|"
    r"\bnan(?:x+)?\b|\binf\b|overflow|exception|unable|cannot|can't|\bnot\b|invalid|\boom\b|"
    r"out of memory|closed|\blost\b|died|exit|signal|skip|\blame\b|preempt|"
    r"\d{10,}\.\d|Traceback \(most recent|"  # an exploded loss; a flattened paste
    r"\.\w+:\d+ -> [1-9]")  # NCCL's error trace (`INFO transport/net_ib.cu:555 -> 2`)

# ... as does a progress bar that reached its end (`Loading checkpoint shards: 100%|███| 33/33
# [00:50<00:00, 1.55s/it]`): the step it counts was done (round 34: both logs of the sets a
# family answered on one are labelled for another cause, not the checkpoint it loaded)
_DONE_BAR = re.compile(r"\b100%\s?\|[^|]*\|\s*(\d+)/\1\b")

# ... and so does a line that reports a miss the program handles itself: a file not found in
# a local copy or cache that it goes on to fetch (`checkpoints/needle2.pkl not found locally,
# downloading from HF...`), at whatever level
_HANDLED_MISS = re.compile(
    r"(?i)\bnot (?:found|present) (?:locally|in (?:the )?(?:local )?cache)\b[,;.]?\s*(?:-+\s*)?"
    r"(?:downloading|fetching|falling back|will (?:download|fetch))")


def reports_success(text: str) -> bool:
    """A line logged at INFO level that names no failure (`ppdet.utils.checkpoint INFO:
    Finish loading model weights: ...pdparams`) or a progress bar at its end (`100%|...|
    33/33`) that names no failure, or one that reports a miss the program
    handles (`... not found locally, downloading from HF...`): it decides nothing, by rule or
    family."""
    return ((_INFO_LEVEL.search(text) is not None or _DONE_BAR.search(text) is not None)
            and _FAILURE_WORD.search(text) is None) or _HANDLED_MISS.search(text) is not None

# exit notices of a batch system or an MPI launcher (Slurm's WTERMSIG and job script, srun,
# mpirun): a SIGKILL they report with no OOM kill anywhere in the logs came from outside
# (Slurm reports its own OOM kills: "Detected 1 oom-kill event(s)", a decisive rule)
_BATCH_NOTICE = re.compile(r"WTERMSIG|slurm_script|slurmstepd|\bsrun: |\bmpi(?:run|exec) noticed|"
                           r"noticed that process rank")
# an attribute asked of None inside checkpoint-loading code (`network.state_dict()` on a model
# not built yet): the code handed the loader nothing, the checkpoint is not read yet (round
# 39: the 7 logs of the sets with `'NoneType' object has no attribute` are none a checkpoint's)
_NONE_ATTRIBUTE = re.compile(r"'NoneType' object has no attribute")


@dataclass(frozen=True)
class RankExit:
    """What the launcher knows about one rank's process."""

    rank: int
    failed: bool
    returncode: int | None = None
    ended_at: datetime | None = None
    oom_killed: bool | None = None  # the kernel's OOM-kill count rose; None: unknown
    node: str | None = None
    # when the rank reached the step before its latest: an error it logged well before, it
    # trained past (two new steps after it)
    second_last_step_at: datetime | None = None
    # a rank that did not fail: True when it was stopped (not exited by itself), and by whom
    stopped: bool = False
    stopped_by: str | None = None  # states.StopCause's value: launcher | outside


@dataclass(frozen=True)
class Candidate:
    tier: int
    category: Category
    domain: FaultDomain
    restart: RestartHelps
    advice: str
    confidence: float
    rank: int | None
    finding: Finding | None = None
    rule: Rule | None = None
    isolate: bool = False
    subcategory: str | None = None
    summary: str | None = None
    at: datetime | None = None

    @property
    def key(self) -> str:
        if self.rule is not None:
            return self.rule.id
        return self.finding.exc_type or "" if self.finding is not None else self.category.value


_SIGNAL_VERDICTS: dict[int, tuple[Category, FaultDomain, RestartHelps, str, str]] = {
    9: (Category.HOST_OOM, FaultDomain.INFRASTRUCTURE, RestartHelps.MAYBE,
        "killed by SIGKILL and left no Python error: most likely the kernel's OOM killer",
        "Check the node's kernel log (dmesg) for the OOM killer; lower host memory per rank "
        "or use a bigger node."),
    7: (Category.SHARED_MEMORY, FaultDomain.INFRASTRUCTURE, RestartHelps.MAYBE,
        "died of SIGBUS (bus error): usually /dev/shm is full",
        "Enlarge /dev/shm (docker --shm-size) or lower DataLoader num_workers."),
    11: (Category.SEGFAULT_OR_ABORT, FaultDomain.FRAMEWORK, RestartHelps.MAYBE,
         "died of SIGSEGV (segmentation fault) in native code",
         "If it repeats at the same step, suspect a library or the code; else restart."),
    6: (Category.SEGFAULT_OR_ABORT, FaultDomain.FRAMEWORK, RestartHelps.MAYBE,
        "died of SIGABRT (aborted)",
        "If it repeats at the same step, suspect a library or the code; else restart."),
    4: (Category.SEGFAULT_OR_ABORT, FaultDomain.FRAMEWORK, RestartHelps.MAYBE,
        "died of SIGILL (illegal instruction)", "Check that the build fits this CPU/GPU."),
    8: (Category.SEGFAULT_OR_ABORT, FaultDomain.FRAMEWORK, RestartHelps.MAYBE,
        "died of SIGFPE (arithmetic error in native code)", "Suspect a library or the code."),
}


def signal_of(returncode: int | None) -> int | None:
    """Popen's negative code, or a shell's 128+N."""
    if returncode is None:
        return None
    if returncode < 0:
        return -returncode
    if 128 < returncode < 160:
        return returncode - 128
    return None


def from_finding(f: Finding, rules: RuleSet) -> Candidate | None:
    rule = rules.by_id(f.rule) if f.rule else None
    if f.exc_type is not None and f.exc_type.rsplit(".", 1)[-1] in _IGNORED_EXCEPTIONS:
        return None
    if rule is not None and rule.role == Role.WEAK and f.config_build:
        rule = None  # a registry raised it: what the config names outweighs a weak reading
    if rule is not None:
        role = rule.role
        if rule.fatal_only and not (f.exc_type is not None and f.final):
            role = Role.HINT
        elif role == Role.CAUSE and _PY_WARNING.search(f.text):
            role = Role.WEAK  # a warning: the process went on after it
        elif role != Role.HINT and f.exc_type is None and reports_success(f.text):
            role = Role.HINT  # an INFO line that names no failure: what went well
        conf = {Role.DECISIVE: 0.95, Role.CAUSE: 0.9 if f.final else 0.85,
                Role.WEAK: 0.6, Role.SYMPTOM: 0.45, Role.HINT: 0.35}[role]
        return Candidate(TIER[role], rule.category, rule.domain, rule.restart, rule.advice,
                          conf, rank_of(f), f, rule, rule.isolate, rule.subcategory, at=f.at)
    if f.exc_type is None:
        return None
    tier = TIER[Role.CAUSE] if f.final else TIER[Role.HINT]
    kind = f.exc_type.rsplit(".", 1)[-1]
    # an exception no rule knows, read by where it was raised (its frames), else the user's
    for raised_there, category, advice in (
            (f.config_build, Category.CONFIG_ERROR,
             "A registry could not build what the config names (a type not registered or "
             "not imported, a missing `type` key): fix the config."),
            (f.checkpoint_load and not _NONE_ATTRIBUTE.search(f.text),
             Category.CHECKPOINT_LOAD_ERROR,
             "Loading the checkpoint failed: it does not fit the model or config (or is "
             "damaged); check the path, model and parallel layout.")):
        if raised_there:
            return Candidate(tier, category, FaultDomain.USER_CODE, RestartHelps.NO, advice,
                              0.75, rank_of(f), f, subcategory=kind, at=f.at)
    where = f" at {f.frame}" if f.frame else " (no traceback in the log says where)"
    return Candidate(
        tier, Category.USER_CODE_ERROR, FaultDomain.USER_CODE, RestartHelps.NO,
        f"Fix the {kind} raised{where}; restarting would fail the same way.",
        0.8 if f.frame else 0.7, rank_of(f), f, subcategory=kind, at=f.at)


def from_exit(rank: int | None, code: int | None, oom: bool | None, at: datetime | None,
               finding: Finding | None) -> Candidate | None:
    sig = signal_of(code)
    if sig is None:
        return None
    who = f"rank {rank}" if rank is not None else "a rank"
    if sig == 9 and oom is None and finding is not None and _BATCH_NOTICE.search(finding.text):
        return Candidate(SIGNAL_TIER, Category.KILLED_BY_SIGNAL_UNKNOWN,
                          FaultDomain.INFRASTRUCTURE, RestartHelps.YES,
                          "Restart; find out who sent the kill (a time limit, a preemption, an "
                          "operator, the node).", 0.6, rank, finding, subcategory="sigkill",
                          at=at, summary=f"{who} was killed by SIGKILL, as the batch system or "
                          "MPI launcher reports, with no OOM kill in the logs")
    if sig == 9 and oom is not None:
        if oom:
            return Candidate(SIGNAL_TIER, Category.HOST_OOM, FaultDomain.INFRASTRUCTURE,
                              RestartHelps.MAYBE, "Lower host memory per rank (batch, DataLoader "
                              "workers) or use a bigger node.", 0.9, rank, finding,
                              subcategory="oom_killer", at=at,
                              summary=f"{who} was killed by the kernel's OOM killer (SIGKILL "
                              "while the node's OOM-kill count rose)")
        return Candidate(SIGNAL_TIER, Category.KILLED_BY_SIGNAL_UNKNOWN,
                          FaultDomain.INFRASTRUCTURE, RestartHelps.YES,
                          "Restart; find out who sent the kill (an operator, a watchdog, a "
                          "scheduler; when testing, TRAINGUARD_FAULT's `signal` fault, which "
                          "the rank's log names).", 0.8, rank, finding, subcategory="sigkill",
                          at=at, summary=f"{who} was killed by SIGKILL, not by the kernel's "
                          "OOM killer (it recorded no OOM kill)")
    if sig in _SIGNAL_VERDICTS:
        cat, dom, helps, text, advice = _SIGNAL_VERDICTS[sig]
        return Candidate(SIGNAL_TIER, cat, dom, helps, advice, 0.55, rank, finding,
                          subcategory=(signal_name(sig) or str(sig)).lower(), at=at,
                          summary=f"{who} {text}")
    name = signal_name(sig) or f"signal {sig}"
    return Candidate(SIGNAL_TIER, Category.KILLED_BY_SIGNAL_UNKNOWN,
                      FaultDomain.INFRASTRUCTURE, RestartHelps.YES,
                      "Restart; find out who sent the signal (an operator, the scheduler, a "
                      "node shutdown).", 0.6, rank, finding, subcategory=name.lower(), at=at,
                      summary=f"{who} was stopped by {name} from outside the job")


# (walk-through 39 #8: the examples' `exit:3` fault failed the job with a bare "read the log")
PLAIN_EXIT_ADVICE = ("The script chose to exit non-zero; read the end of its log (when "
                     "testing, TRAINGUARD_FAULT's `exit` fault ends a rank so: an exit the "
                     "script chose is restarted only with --unconditional-restart).")


def plain_exit(e: RankExit) -> Candidate:
    """A rank that exited non-zero and whose log says nothing: the script chose to stop."""
    return Candidate(SIGNAL_TIER, Category.OTHER, FaultDomain.USER_CODE, RestartHelps.NO,
                      PLAIN_EXIT_ADVICE, 0.3,
                      e.rank, at=e.ended_at, subcategory=f"exit_code_{e.returncode}",
                      summary=f"rank {e.rank} {ended_how(e.returncode)} and left no known "
                      "error in its log")


def ended_how(returncode: int | None) -> str:
    """'exited with code N', or for an end never reported (its node lost) what is known."""
    return (f"exited with code {returncode}" if returncode is not None
            else "ended with no exit code reported (its node was lost, or its agent)")


def rank_of(f: Finding) -> int | None:
    if f.rank is not None:
        return f.rank
    m = _RANK_IN_TEXT.search(f.text)
    return int(next(g for g in m.groups() if g is not None)) if m else None
