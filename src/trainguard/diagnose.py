"""Why did an attempt fail? Pure: (worker exits, log tails, error files) -> Diagnosis.

The attempt is judged by its first *real* failure: ranks that failed because a peer died
("Connection reset by peer", collective timeouts) are symptoms, not causes.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import Enum

from trainguard.exitcodes import signal_name
from trainguard.logformat import parse_stamped
from trainguard.protocol import WorkerFact, WorkerState


class RestartHelps(str, Enum):
    YES = "yes"
    NO = "no"
    MAYBE = "maybe"


@dataclass(frozen=True)
class Rule:
    category: str
    domain: str
    restart: RestartHelps
    pattern: re.Pattern[str]
    advice: str
    symptom: bool = False  # what healthy ranks print when a peer dies or stalls
    isolate: bool = False  # the evidence points at the machine
    weak: bool = False  # often a consequence (teardown abort after an exception, a watchdog)


def _rule(
    category: str, domain: str, restart: str, pattern: str, advice: str, **kw: bool
) -> Rule:
    return Rule(category, domain, RestartHelps(restart), re.compile(pattern), advice, **kw)


# Order matters: the first rule that matches a line wins. Symptoms last.
RULES: tuple[Rule, ...] = (
    _rule("gpu_hardware", "hardware", "yes",
          r"\bXid\b\D{0,40}\b(?:48|63|64|74|79|94|95)\b|uncorrectable ECC error"
          r"|GPU has fallen off the bus",
          "The GPU reports a hardware fault: isolate the node and restart elsewhere.",
          isolate=True),
    _rule("gpu_oom", "user_code", "no", r"CUDA out of memory|OutOfMemoryError",
          "The model does not fit in GPU memory: reduce the batch size or shard the model."),
    _rule("host_oom", "infrastructure", "yes",
          r"\bMemoryError\b|Out of memory: Killed process|oom-kill|Cannot allocate memory",
          "The host ran out of memory: lower per-rank memory or use a bigger node."),
    _rule("shared_memory", "infrastructure", "yes",
          r"unable to write to file </torch_|insufficient shared memory|/dev/shm|Bus error",
          "Shared memory (/dev/shm) is too small: enlarge it or lower DataLoader num_workers."),
    _rule("disk_full_or_storage_io", "storage", "maybe",
          r"No space left on device|\[Errno 28\]|Input/output error|Stale file handle",
          "Storage is full or failing: free space or fix the mount, then restart."),
    _rule("port_conflict", "network", "yes", r"Address already in use|EADDRINUSE",
          "A port the job needs is taken: the next attempt picks a fresh port."),
    _rule("nccl_communication_error", "network", "yes",
          r"NCCL error|ncclSystemError|ncclRemoteError|ncclInternalError",
          "A collective's communication link failed: usually transient; restart."),
    _rule("cuda_kernel_error", "framework", "no", r"device-side assert triggered",
          "A CUDA kernel assertion failed, usually an index out of range in user code."),
    _rule("cuda_kernel_error", "framework", "maybe", r"illegal memory access|CUDA error",
          "A CUDA kernel failed: if it repeats on one node, suspect the GPU.", weak=True),
    _rule("dataloader_worker_crash", "framework", "maybe",
          r"DataLoader worker \(pid\(?s?\)?[^)]*\) (?:is killed by signal|exited unexpectedly)",
          "A DataLoader worker died: check its memory use and /dev/shm."),
    _rule("segfault_or_abort", "framework", "maybe",
          r"Segmentation fault|Fatal Python error|core dumped|terminate called",
          "A native crash: if it repeats at the same step, suspect the code or a library version.",
          weak=True),
    _rule("numerical", "user_code", "no",
          r"(?i)\bloss is nan\b|FloatingPointError|non-finite loss",
          "Training diverged: lower the learning rate or check the data."),
    _rule("dependency_or_import_error", "user_code", "no", r"ModuleNotFoundError|ImportError",
          "A module is missing: install it in the job's environment."),
    _rule("checkpoint_load_error", "user_code", "no",
          r"Error\(s\) in loading state_dict|PytorchStreamReader failed|UnpicklingError",
          "A checkpoint could not be loaded: it is corrupt or from another model."),
    _rule("network_or_rendezvous", "network", "yes",
          r"RendezvousTimeoutError|Name or service not known|Network is unreachable"
          r"|No route to host",
          "The network or rendezvous failed: usually transient; restart."),
    # Symptoms: what healthy ranks print when a peer dies or stalls.
    _rule("network_or_rendezvous", "network", "yes",
          r"Connection reset by peer|Connection closed by peer|Broken pipe|Connection refused"
          r"|DistNetworkError|DistStoreError|Socket Timeout|EOF from connection",
          "A peer went away; look at the rank that failed first.", symptom=True),
    _rule("nccl_timeout_or_hang", "framework", "yes",
          r"Watchdog caught collective operation timeout|Timed out waiting|[Tt]imeout.*gloo"
          r"|gloo.*[Tt]imed? ?out",
          "A collective timed out: usually a symptom of a rank that died or hung.", symptom=True),
)

_TRACEBACK = "Traceback (most recent call last):"
_EXC_LINE = re.compile(
    r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Failure|Warning)\w*)(?::\s?(.*))?$")

_SIGNAL_VERDICTS: dict[int, tuple[str, str, RestartHelps, str]] = {
    signal.SIGKILL: ("host_oom", "infrastructure", RestartHelps.YES,
                     "Killed by SIGKILL with no Python error: most likely the kernel's OOM killer "
                     "or a kill from outside."),
    signal.SIGBUS: ("shared_memory", "infrastructure", RestartHelps.YES,
                    "Bus error (SIGBUS): usually /dev/shm is full; enlarge it."),
    signal.SIGSEGV: ("segfault_or_abort", "framework", RestartHelps.MAYBE,
                     "Segmentation fault in native code."),
    signal.SIGABRT: ("segfault_or_abort", "framework", RestartHelps.MAYBE, "Aborted (SIGABRT)."),
    signal.SIGILL: ("segfault_or_abort", "framework", RestartHelps.MAYBE, "Illegal instruction."),
    signal.SIGFPE: ("segfault_or_abort", "framework", RestartHelps.MAYBE,
                    "Floating-point exception."),
}


@dataclass(frozen=True)
class Diagnosis:
    category: str
    fault_domain: str
    restart_helps: RestartHelps
    summary: str
    advice: str
    culprit_rank: int | None = None
    evidence: str | None = None
    symptoms: tuple[str, ...] = field(default_factory=tuple)
    isolate_node: bool = False
    confidence: float = 0.5
    from_log: bool = False  # decided by a line in the log (fault scenario error_in_log)

    def to_dict(self) -> dict[str, object]:
        return {
            "category": self.category, "fault_domain": self.fault_domain,
            "restart_helps": self.restart_helps.value, "summary": self.summary,
            "advice": self.advice, "culprit": {"rank": self.culprit_rank},
            "evidence": self.evidence, "symptoms": list(self.symptoms),
            "isolate_node": self.isolate_node, "confidence": self.confidence,
        }


@dataclass(frozen=True)
class _RankVerdict:
    diagnosis: Diagnosis
    symptom: bool
    at: datetime | None  # when its evidence was seen (log line read, else the exit)


@dataclass(frozen=True)
class _Line:
    at: datetime | None
    text: str


_RANK_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]:\s?")


def strip_prefix(line: str) -> str:
    """Drop torch's `[rankN]: ` prefix on uncaught-exception output."""
    return _RANK_PREFIX.sub("", line, count=1)


def _lines(tail: list[str], before: datetime | None) -> list[_Line]:
    out = []
    for raw in tail:
        at, _, text = parse_stamped(raw)
        if before is None or at is None or at <= before:
            out.append(_Line(at, strip_prefix(text)))
    return out


def _final_exception(lines: list[_Line]) -> _Line | None:
    start = max((i for i, ln in enumerate(lines) if ln.text.strip() == _TRACEBACK), default=None)
    if start is None:
        return None
    for ln in lines[start + 1:]:
        if not ln.text.startswith((" ", "\t")) and _EXC_LINE.match(ln.text.strip()):
            return _Line(ln.at, ln.text.strip())
    return None


def final_exception(lines: list[str]) -> str | None:
    """The `Type: message` line that ends the last Python traceback in `lines`, if any."""
    found = _final_exception(_lines(lines, None))
    return None if found is None else found.text


def _error_file_exception(fact: WorkerFact) -> _Line | None:
    """torch @record's error file: {"message": {"message": ..., "extraInfo": {"timestamp"}}}."""
    msg = (fact.error_file or {}).get("message")
    at = None
    if isinstance(msg, dict):
        ts = (msg.get("extraInfo") or {}).get("timestamp")
        if isinstance(ts, (int, str)) and str(ts).isdigit():
            at = datetime.fromtimestamp(int(ts), timezone.utc)
        msg = msg.get("message")
    return _Line(at, msg.strip().splitlines()[-1]) if isinstance(msg, str) and msg.strip() else None


def _match(line: str) -> Rule | None:
    return next((r for r in RULES if r.pattern.search(line)), None)


def diagnose_rank(fact: WorkerFact, before: datetime | None = None) -> _RankVerdict:
    """Verdict on one worker from its exit, error file and log tail (lines read <= before).

    Precedence: a strong known cause (highest-priority rule, then earliest line) > the
    final Python exception > a symptom > a weak cause (an abort, a generic CUDA error,
    usually a consequence) > the signal that killed it > "other".
    """
    lines = _lines(fact.log_tail[-200:], before)
    exc = _error_file_exception(fact) or _final_exception(lines)
    sig = fact.signal_number or _shell_signal(fact.returncode)
    if exc is not None and sig is not None and exc.text.startswith("KeyboardInterrupt"):
        exc = None  # Python's way of dying of SIGINT: the signal is the fact
    matches = [(ln, r) for ln in ([exc] if exc else []) + lines if (r := _match(ln.text))]
    symptoms = tuple(ln.text for ln, r in reversed(matches) if r.symptom)
    # A "restart will not help" verdict needs the process to have died of that error: a
    # stray warning line ("ImportError: no apex, using native") must not fail the job.
    fatal = exc.text if exc is not None else None
    strong = [(ln, r) for ln, r in matches if not r.symptom and not r.weak
              and (r.restart != RestartHelps.NO or ln.text.strip() == fatal)]
    if strong:
        line, rule = min(strong, key=lambda m: RULES.index(m[1]))
        return _from_rule(fact, line, rule, symptoms, symptom=False)
    if exc is not None:
        rule_exc = _match(exc.text)
        if rule_exc is not None:
            return _from_rule(fact, exc, rule_exc, symptoms, symptom=rule_exc.symptom)
        return _RankVerdict(Diagnosis(
            "user_code_error", "user_code", RestartHelps.NO,
            f"rank {fact.rank} raised {exc.text[:300]}",
            "Fix the error in the training script; restarting would fail the same way.",
            fact.rank, exc.text, confidence=0.8, from_log=True), False, exc.at or fact.ended_at)
    for kind in ("symptom", "weak"):
        found = [(ln, r) for ln, r in matches if getattr(r, kind)]
        if found:
            return _from_rule(fact, *found[0], symptoms, symptom=kind == "symptom")
    if sig == signal.SIGKILL and fact.state == WorkerState.FAILED and fact.oom_killed is not None:
        return _sigkill_verdict(fact, fact.oom_killed)
    if sig is not None and fact.state == WorkerState.FAILED:
        cat, domain, helps, text = _SIGNAL_VERDICTS.get(sig, (
            "killed_by_signal_unknown", "infrastructure", RestartHelps.YES,
            f"Stopped by {signal_name(sig)} from outside the job."))
        return _RankVerdict(Diagnosis(cat, domain, helps, f"rank {fact.rank}: {text}",
                                      "Restart; if it repeats, look at the node's kernel log.",
                                      fact.rank, None, confidence=0.6), False, fact.ended_at)
    return _RankVerdict(Diagnosis(
        "other", "user_code", RestartHelps.NO,
        f"rank {fact.rank} exited with code {fact.returncode} and left no error in its log",
        "The script chose to exit non-zero; check its own output.",
        fact.rank, None, confidence=0.3), False, fact.ended_at)


def _sigkill_verdict(fact: WorkerFact, oom: bool) -> _RankVerdict:
    """SIGKILL when the kernel's OOM-kill count tells whether the OOM killer did it."""
    if oom:
        diag = Diagnosis("host_oom", "infrastructure", RestartHelps.YES,
                         f"rank {fact.rank}: killed by the kernel's OOM killer (SIGKILL while "
                         "the node's OOM-kill count rose)",
                         "Lower per-rank host memory (batch, DataLoader workers) or use a "
                         "bigger node.", fact.rank, None, confidence=0.9)
    else:
        diag = Diagnosis("killed_by_signal_unknown", "infrastructure", RestartHelps.YES,
                         f"rank {fact.rank}: killed by SIGKILL from outside the job (the kernel "
                         "recorded no OOM kill)",
                         "Restart; find out who sent the kill (an operator, a watchdog, a "
                         "scheduler).", fact.rank, None, confidence=0.8)
    return _RankVerdict(diag, False, fact.ended_at)


def _from_rule(
    fact: WorkerFact, line: _Line, rule: Rule, symptoms: tuple[str, ...], *, symptom: bool
) -> _RankVerdict:
    seen = tuple(s for s in symptoms if s != line.text)[:5]
    diag = Diagnosis(rule.category, rule.domain, rule.restart,
                     f"rank {fact.rank}: {line.text.strip()[:300]}", rule.advice, fact.rank,
                     line.text, seen, rule.isolate, 0.5 if symptom else 0.8, from_log=True)
    return _RankVerdict(diag, symptom, line.at or fact.ended_at)


def _shell_signal(returncode: int | None) -> int | None:
    """Exit codes 129-159 are how shells report a child killed by signal code-128."""
    if returncode is not None and 128 < returncode < 160:
        return returncode - 128
    return None


def diagnose_attempt(facts: list[WorkerFact], detected_at: datetime | None = None
                     ) -> Diagnosis | None:
    """The attempt's root cause: the earliest failure that is not a symptom of another.

    Candidates are the ranks that failed, and ranks stopped by the launcher whose log
    showed an error before the failure was detected (a rank can print its traceback and
    still be tearing down when a peer's symptom ends the attempt). Order: when the
    evidence was seen (log line read time), else when the process ended.
    """
    if not any(f.state == WorkerState.FAILED for f in facts):
        return None
    judged = [(f, diagnose_rank(f, detected_at)) for f in facts
              if f.state in (WorkerState.FAILED, WorkerState.STOPPED)]
    verdicts = [v for f, v in judged if f.state == WorkerState.FAILED or v.diagnosis.from_log]
    verdicts.sort(key=lambda v: (v.at is None, v.at or datetime.max.replace(tzinfo=timezone.utc)))
    root = next((v for v in verdicts if not v.symptom), verdicts[0])
    others = tuple(
        f"rank {v.diagnosis.culprit_rank}: {v.diagnosis.evidence or v.diagnosis.category}"
        for v in verdicts if v is not root
    )
    d = root.diagnosis
    return Diagnosis(d.category, d.fault_domain, d.restart_helps, d.summary, d.advice,
                     d.culprit_rank, d.evidence, (d.symptoms + others)[:10], d.isolate_node,
                     d.confidence, d.from_log)
