"""The per-node pre-check, pure side: its settings, thresholds, verdicts and report shapes.

The platform runs a pre-check before an attempt starts (disk space, /dev/shm, accelerators
visible, ulimits) and reports each check as an event. precheck.py reads this node's facts;
the judges here turn each fact into a CheckResult whose `detail` names the problem with its
numbers and whose `fix` says what to change. No I/O here.

Sizes: "mb" settings are MiB (1024 * 1024 bytes), the unit `df -m` and Docker's `--shm-size`
use (Docker's default /dev/shm of "64m" is exactly 64 MiB, so it passes `min_shm_mb=64`).
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field, field_validator

from trainguard.spec import flag_name

MIB = 1024 * 1024

CHECK_PYTHON = "python"
CHECK_SHM = "shm"
CHECK_ACCELERATORS = "accelerators"
CHECK_PORTS = "ports"
CHECK_NOFILE = "nofile"
CHECK_AGENT = "agent"  # the controller's: a node that gave no pre-check answer fails it


def disk_check_name(path: str) -> str:
    return f"disk:{path}"


def import_check_name(module: str) -> str:
    return f"import:{module}"


class CheckResult(BaseModel):
    """One check's verdict. `value` is its measured number where it has one (free MiB,
    devices found, seconds to import, ports bound, the open-files limit)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    ok: bool
    detail: str
    fix: str | None = None
    value: float | None = None


class PrecheckReport(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    node: str
    host: str
    at: datetime
    checks: list[CheckResult]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failed(self) -> list[CheckResult]:
        return [c for c in self.checks if not c.ok]

    def summary(self) -> str:
        """One line: `precheck on node-0 (host-a): ok, 7 checks`, or the failed checks with
        their details: `precheck on node-0 (host-a): 2 of 7 failed: shm: ...; ports: ...`."""
        where = f"precheck on {self.node}" + (f" ({self.host})" if self.host else "")
        bad = self.failed
        if not bad:
            return f"{where}: ok, {len(self.checks)} checks"
        items = "; ".join(f"{c.name}: {_one_line(c.detail)}" for c in bad)
        return f"{where}: {len(bad)} of {len(self.checks)} failed: {items}"


def _is_module_name(name: str) -> bool:
    return bool(name) and all(part.isidentifier() for part in name.split("."))


class PrecheckConfig(BaseModel):
    """What this node must offer before an attempt starts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    python: str = Field(min_length=1, description="interpreter the workers run with")
    paths: list[str] = Field(description="job dir, checkpoint dir...: free space where they "
                             "live (a path that does not exist yet: its nearest existing "
                             "parent); remote URLs (s3://...) are not checked")
    min_free_disk_mb: float = Field(1024, ge=0)
    min_shm_mb: float = Field(64, ge=0, description="/dev/shm size and free space, MiB")
    expect_accelerators: int = Field(0, ge=0, description="0 = not judged")
    import_modules: list[str] = Field(default_factory=lambda: ["torch"])
    import_timeout_s: float = Field(120, gt=0, description="per module import")
    ports: int = Field(1, ge=0, le=4096, description="free TCP ports that must be bindable")
    fixed_ports: list[int] = Field(default_factory=list,
                                   description="specific TCP ports that must be free "
                                   "(a master/rendezvous port)")
    bind_addr: str = Field("0.0.0.0", min_length=1)
    min_nofile: int = Field(1024, ge=0, description="RLIMIT_NOFILE soft limit (ulimit -n)")

    @field_validator("import_modules")
    @classmethod
    def _modules_are_names(cls, v: list[str]) -> list[str]:
        bad = [m for m in v if not _is_module_name(m)]
        if bad:
            raise ValueError(f"not module names: {bad}")
        return v

    @field_validator("fixed_ports")
    @classmethod
    def _ports_in_range(cls, v: list[int]) -> list[int]:
        bad = [p for p in v if not 1 <= p <= 65535]
        if bad:
            raise ValueError(f"ports out of 1-65535: {bad}")
        return v


def _one_line(text: str) -> str:
    return " ".join(text.split())


def mib(n_bytes: float) -> str:
    return f"{n_bytes / MIB:.0f} MiB" if n_bytes >= 10 * MIB else f"{n_bytes / MIB:.2f} MiB"


def is_local_path(path: str) -> bool:
    """False for fsspec URLs (s3://bucket/x, gs://...); file:// counts as local."""
    scheme, sep, _ = path.partition("://")
    return not sep or scheme == "file" or not scheme.isalnum()


def local_part(path: str) -> str:
    return path[len("file://"):] if path.startswith("file://") else path


def judge_disk(path: str, free_bytes: int, min_free_mb: float, *, judged_at: str | None = None,
               writable: bool = True) -> CheckResult:
    """`judged_at`: the nearest existing parent when `path` does not exist yet."""
    name = disk_check_name(path)
    where = path if judged_at in (None, path) else f"{path} (judged at {judged_at})"
    value = free_bytes / MIB
    if not writable:
        return CheckResult(name=name, ok=False, value=value,
                           detail=f"{where} is not writable (read-only filesystem or "
                           "permissions)",
                           fix="mount it read-write, or point the job at a writable directory")
    need = min_free_mb * MIB
    if free_bytes < need:
        return CheckResult(name=name, ok=False, value=value,
                           detail=f"{where}: {mib(free_bytes)} free, need {mib(need)}",
                           fix=f"free at least {mib(need - free_bytes)} there (old checkpoints, "
                           "logs), or move it to a larger volume")
    return CheckResult(name=name, ok=True, value=value,
                       detail=f"{where}: {mib(free_bytes)} free (need {mib(need)})")


def judge_shm(size_bytes: int | None, free_bytes: int | None, min_mb: float) -> CheckResult:
    """None: /dev/shm is missing."""
    need = min_mb * MIB
    if size_bytes is None or free_bytes is None:
        return CheckResult(name=CHECK_SHM, ok=False, detail="/dev/shm is missing",
                           fix="mount a tmpfs at /dev/shm (docker run --shm-size=8g, or a "
                           "Kubernetes emptyDir with medium: Memory)")
    fix = ("give the container a larger /dev/shm (docker run --shm-size=8g, or a Kubernetes "
           "emptyDir with medium: Memory and a sizeLimit); DataLoader workers and NCCL use it")
    if size_bytes < need:
        return CheckResult(name=CHECK_SHM, ok=False, value=size_bytes / MIB, fix=fix,
                           detail=f"/dev/shm is {mib(size_bytes)}, need {mib(need)}")
    if free_bytes < need:
        return CheckResult(name=CHECK_SHM, ok=False, value=free_bytes / MIB,
                           detail=f"/dev/shm has {mib(free_bytes)} free of {mib(size_bytes)}, "
                           f"need {mib(need)}",
                           fix="remove leftovers of earlier runs from /dev/shm (stale "
                           "torch_* / psm_* / nccl-* segments), or enlarge it")
    return CheckResult(name=CHECK_SHM, ok=True, value=free_bytes / MIB,
                       detail=f"/dev/shm: {mib(free_bytes)} free of {mib(size_bytes)} "
                       f"(need {mib(need)})")


def visible_count(device_nodes: int, visible_env: str | None) -> int:
    """Devices a process can use: the device nodes, narrowed by a CUDA_VISIBLE_DEVICES-style
    list (indices or UUIDs; as CUDA does, the list ends at the first invalid entry, so ""
    and "-1" hide every device)."""
    if visible_env is None:
        return device_nodes
    listed = 0
    for entry in visible_env.split(","):
        e = entry.strip()
        if not e or e.startswith("-"):
            break
        listed += 1
    return min(device_nodes, listed)


def judge_accelerators(found: int, expected: int, *, kind: str = "accelerators",
                       source: str = "") -> CheckResult:
    """`kind`: what was counted ("NVIDIA GPUs", "Ascend NPUs"); `source`: how (device nodes,
    the visibility variable), for the detail."""
    how = f" ({source})" if source else ""
    if expected <= 0:
        return CheckResult(name=CHECK_ACCELERATORS, ok=True, value=found,
                           detail=f"not expected; {found} {kind} visible{how}")
    if found < expected:
        return CheckResult(name=CHECK_ACCELERATORS, ok=False, value=found,
                           detail=f"{found} {kind} visible, expected {expected}{how}",
                           fix="check the driver (nvidia-smi / npu-smi info), the devices "
                           "given to the container, and CUDA_VISIBLE_DEVICES / "
                           "ASCEND_RT_VISIBLE_DEVICES; a node that lost a device should be "
                           "isolated")
    return CheckResult(name=CHECK_ACCELERATORS, ok=True, value=found,
                       detail=f"{found} {kind} visible, expected {expected}{how}")


def last_error_line(stderr: str) -> str:
    """The line that names the error: the last non-blank one of a traceback."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def judge_python(python: str, returncode: int | None, output: str, error: str | None = None
                 ) -> CheckResult:
    """`error`: why the interpreter could not start (OSError text); returncode None: it timed
    out; `output`: what it printed (its version), or its stderr when it failed."""
    fix = "set python to an interpreter that exists on this node (the job's environment)"
    if error is not None:
        return CheckResult(name=CHECK_PYTHON, ok=False, fix=fix,
                           detail=f"cannot run {python}: {error}")
    if returncode is None:
        return CheckResult(name=CHECK_PYTHON, ok=False, fix=fix,
                           detail=f"{python} did not answer in time")
    if returncode != 0:
        return CheckResult(name=CHECK_PYTHON, ok=False, fix=fix,
                           detail=f"{python} exited {returncode}: "
                           f"{last_error_line(output) or 'no output'}")
    return CheckResult(name=CHECK_PYTHON, ok=True, detail=f"Python {output.strip()} at {python}")


def judge_import(module: str, returncode: int | None, stderr_tail: str, seconds: float, *,
                 python: str = "python", timeout_s: float | None = None) -> CheckResult:
    """returncode None: the import did not finish within `timeout_s`."""
    name = import_check_name(module)
    if returncode is None:
        limit = f"{timeout_s:.0f} s" if timeout_s is not None else "its time limit"
        return CheckResult(name=name, ok=False, value=seconds,
                           detail=f"import {module} did not finish in {limit} ({python})",
                           fix="check the storage the environment lives on (a slow or hung "
                           "shared filesystem) and the driver; then raise import_timeout_s")
    if returncode != 0:
        why = last_error_line(stderr_tail) or "no error output"
        how = f"exit {returncode}" if returncode > 0 else f"killed by signal {-returncode}"
        return CheckResult(name=name, ok=False, value=seconds,
                           detail=f"import {module} failed in {python} ({how}, "
                           f"{seconds:.2f} s): {why}",
                           fix=f"install {module} into that environment ({python} -m pip "
                           f"install ...), or set python to the environment that has it")
    return CheckResult(name=name, ok=True, value=seconds,
                       detail=f"import {module} ok in {seconds:.2f} s ({python})")


def judge_ports(bound: int, wanted: int, error: str | None, *, bind_addr: str = "0.0.0.0",
                fixed: list[int] | None = None) -> CheckResult:
    """`bound`: how many of the `wanted` sockets bound (fixed ports included) before `error`."""
    what = f"{wanted} TCP port(s) on {bind_addr}"
    if fixed:
        what += f" (including {', '.join(map(str, fixed))})"
    if bound < wanted or error is not None:
        return CheckResult(name=CHECK_PORTS, ok=False, value=bound,
                           detail=f"bound {bound} of {what}: {error or 'no error given'}",
                           fix="stop what holds the port (ss -ltnp), pick another port, or "
                           "set bind_addr to an address of this node; 'Too many open files' "
                           "means ulimit -n is too low")
    return CheckResult(name=CHECK_PORTS, ok=True, value=bound, detail=f"bound {what}")


def judge_nofile(soft: int | None, hard: int | None, minimum: int = 1024) -> CheckResult:
    """RLIMIT_NOFILE (ulimit -n); None = unlimited (then `value` is None too)."""
    def show(n: int | None) -> str:
        return "unlimited" if n is None else str(n)

    value = None if soft is None else float(soft)
    limits = f"soft {show(soft)}, hard {show(hard)}"
    if soft is not None and soft < minimum:
        can = hard is None or hard >= minimum
        fix = (f"raise it before starting: ulimit -n {minimum if hard is None else hard}"
               if can else f"raise the hard limit (nofile in /etc/security/limits.conf, "
               f"docker --ulimit nofile={minimum}:{minimum}, or the pod's runtime)")
        return CheckResult(name=CHECK_NOFILE, ok=False, value=value, fix=fix,
                           detail=f"open files limit (ulimit -n) is {limits}, need {minimum}")
    return CheckResult(name=CHECK_NOFILE, ok=True, value=value,
                       detail=f"open files limit (ulimit -n): {limits} (need {minimum})")


def check_crashed(name: str, exc: BaseException) -> CheckResult:
    """A check that raised: failed, naming the exception (a pre-check never raises)."""
    return CheckResult(name=name, ok=False, detail=f"check raised {type(exc).__name__}: {exc}",
                       fix="see the detail; this node's environment is not as expected")


def failed_everywhere(failing: tuple[PrecheckReport, ...], checked: int) -> list[CheckResult]:
    """The checks that failed on every node checked (the first failing node's verdicts):
    a job setting or every node's environment, which no other node can pass either. Empty
    when some node passed, or only an unanswered pre-check is common (the nodes said nothing
    of themselves)."""
    if not failing or len(failing) < checked:
        return []
    common = set.intersection(*({c.name for c in r.failed} for r in failing)) - {CHECK_AGENT}
    return [c for c in failing[0].failed if c.name in common]


def everywhere_fix(check: CheckResult) -> str:
    """What to change when `check` fails on every node: the job setting it judges by, or
    the one environment every node shares."""
    if check.name == CHECK_ACCELERATORS:
        return (f"lower {flag_name('expect_accelerators')} to the devices the nodes have (0: "
                "not checked), or run the job on nodes that have them")
    if check.name.startswith(disk_check_name("")):
        return (f"{check.fix or 'see the detail'} (the job dir and checkpoint dir: --job-dir, "
                f"--checkpoint-dir; the space asked for: {flag_name('min_free_disk_mb')})")
    return (f"{check.fix or 'see the detail'}, on every node (or skip the pre-check: "
            f"{flag_name('precheck')})")
