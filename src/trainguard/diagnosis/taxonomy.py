"""What a diagnosis says: the category ids, fault domains and the verdict's shape. Pure."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Any


class Category(str, Enum):
    GPU_OOM = "gpu_oom"
    HOST_OOM = "host_oom"
    NCCL_TIMEOUT_OR_HANG = "nccl_timeout_or_hang"
    NCCL_COMMUNICATION_ERROR = "nccl_communication_error"
    GPU_HARDWARE = "gpu_hardware"
    NPU_HARDWARE_OR_DRIVER = "npu_hardware_or_driver"
    CUDA_KERNEL_ERROR = "cuda_kernel_error"
    SEGFAULT_OR_ABORT = "segfault_or_abort"
    DISK_FULL_OR_STORAGE_IO = "disk_full_or_storage_io"
    NETWORK_OR_RENDEZVOUS = "network_or_rendezvous"
    PORT_CONFLICT = "port_conflict"
    DATALOADER_WORKER_CRASH = "dataloader_worker_crash"
    SHARED_MEMORY = "shared_memory"
    NUMERICAL = "numerical"
    USER_CODE_ERROR = "user_code_error"
    DEPENDENCY_OR_IMPORT_ERROR = "dependency_or_import_error"
    CHECKPOINT_LOAD_ERROR = "checkpoint_load_error"
    CONFIG_ERROR = "config_error"
    KILLED_BY_SIGNAL_UNKNOWN = "killed_by_signal_unknown"
    OTHER = "other"


# The subcategory of a program Python could not start (no module for -m, no script): nothing
# of the job ran, so the launcher exits as for bad flags (ExitCode.USAGE). rules.yaml uses it.
NOT_STARTED = "not_started"
# the object store has no bucket of that name (rules.yaml, object-store-bucket-missing)
BUCKET_MISSING = "storage_bucket_missing"
# a hang trainguard's detector confirmed (no progress; diagnosis/hung.py), not a log's timeout
HANG = "hang"


class FaultDomain(str, Enum):
    HARDWARE = "hardware"
    INFRASTRUCTURE = "infrastructure"
    NETWORK = "network"
    STORAGE = "storage"
    USER_CODE = "user_code"
    FRAMEWORK = "framework"


class RestartHelps(str, Enum):
    YES = "yes"
    NO = "no"
    MAYBE = "maybe"


class Role(str, Enum):
    """How much a matching line says about the root cause (strongest first).

    decisive: names the machine or the kernel as the cause wherever it appears (Xid 79,
      an ECC error, the OOM killer's own message): it wins over earlier lines.
    cause: a real error; the earliest one across ranks is the root cause.
    weak: an error that is usually a consequence (an abort while tearing down, a generic
      CUDA error): it decides only when no cause is found.
    symptom: what healthy ranks print when a peer died or stalled (watchdog timeouts,
      "Connection reset by peer", torchrun's ChildFailedError summary).
    hint: an error-looking line the process did not die of (a warning that mentions an
      ImportError): better than nothing, worse than a symptom.
    """

    DECISIVE = "decisive"
    CAUSE = "cause"
    WEAK = "weak"
    SYMPTOM = "symptom"
    HINT = "hint"


@dataclass(frozen=True)
class Evidence:
    """One log line, verbatim (prefixes stripped only in `text`), and where it is."""

    file: str  # "" when the evidence is an exit status, not a line
    line: int  # 1-based; 0 with no file
    text: str
    rank: int | None = None
    at: datetime | None = None
    count: int = 1  # how many ranks printed the same thing (symptoms are grouped; the
    # evidence counts its copies on other ranks, which are then no symptoms)
    more: tuple[str, ...] = ()  # the next lines of a message that spans lines

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"file": self.file, "line": self.line, "text": self.text}
        if self.more:
            d["more"] = list(self.more)
        if self.rank is not None:
            d["rank"] = self.rank
        if self.at is not None:
            d["at"] = self.at.isoformat()
        if self.count > 1:
            d["count"] = self.count
        return d

    def where(self) -> str:
        """`file:line`, or `exit` for what a process's exit status says."""
        return f"{self.file}:{self.line}" if self.file else "exit"


@dataclass(frozen=True)
class Culprit:
    rank: int | None = None
    node: str | None = None
    frame: str | None = None  # "train.py:88 in forward": the user-code frame that raised
    in_library: bool | None = None  # the exception came from inside a library's code

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "node": self.node, "frame": self.frame,
                "in_library": self.in_library}


# the categories named after NCCL that cover every collective library (Diagnosis.library)
_NAMED_FOR_NCCL = (Category.NCCL_COMMUNICATION_ERROR, Category.NCCL_TIMEOUT_OR_HANG)


@dataclass(frozen=True)
class Diagnosis:
    category: Category
    fault_domain: FaultDomain
    restart_helps: RestartHelps
    summary: str
    advice: str
    culprit: Culprit = field(default_factory=Culprit)
    evidence: Evidence | None = None
    symptoms: tuple[Evidence, ...] = ()
    isolate_node: bool = False
    confidence: float = 0.5
    subcategory: str | None = None
    rule: str | None = None  # the id of the rule that decided, if one did
    from_log: bool = False  # decided by a log line (fault scenario error_in_log)

    @property
    def culprit_rank(self) -> int | None:
        return self.culprit.rank

    @property
    def library(self) -> str | None:
        """For a category named after NCCL whose deciding line is another collective
        library's (gloo, HCCL): which, so that a gloo job's reader is not sent looking for
        NCCL; None otherwise."""
        text = (self.evidence.text if self.evidence is not None else "").lower()
        if self.category not in _NAMED_FOR_NCCL or "nccl" in text:
            return None
        return next((name for key, name in (("gloo", "gloo"), ("hccl", "HCCL")) if key in text),
                    None)

    @property
    def library_note(self) -> str:
        """Said beside the category id (`diagnose`, the FailureDiagnosed event) when the id
        names NCCL and the deciding line is gloo's or HCCL's, or when it is a hang trainguard
        confirmed; "" otherwise."""
        if self.subcategory == HANG:  # no log line: a gloo job's, or one in no collective
            # at all, read NCCL (walk-through 39 #13)
            return " [no progress: the category covers a hang with any collective library or none]"
        lib = self.library
        return f" [{lib}'s: the category covers NCCL, gloo and HCCL]" if lib else ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "category": self.category.value,
            "subcategory": self.subcategory,
            "fault_domain": self.fault_domain.value,
            "restart_helps": self.restart_helps.value,
            "isolate_node": self.isolate_node,
            "culprit": self.culprit.to_dict(),
            "summary": self.summary,
            "evidence": None if self.evidence is None else self.evidence.to_dict(),
            "symptoms": [s.to_dict() for s in self.symptoms],
            "advice": self.advice,
            "confidence": round(self.confidence, 2),
            "rule": self.rule,
            "library": self.library,
        }
