"""The per-node pre-check, I/O side: reads this node's facts and has policy.precheck judge them.

`run_precheck` never raises for a failed check: a check that raises becomes a failed
CheckResult naming the exception. The interpreter and module imports are the slow part (~1.5 s
for torch), so their *successes* can be kept in an `import_cache` shared between runs on one
node (keyed by (python, module); the interpreter check by (python, "")); failures are
re-checked every run, so a node that was fixed passes the next time. A cached run is a few ms.
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import TypeAlias

from trainguard.policy.precheck import (
    CHECK_ACCELERATORS,
    CHECK_NOFILE,
    CHECK_PORTS,
    CHECK_PYTHON,
    CHECK_SHM,
    CheckResult,
    PrecheckConfig,
    PrecheckReport,
    check_crashed,
    disk_check_name,
    import_check_name,
    is_local_path,
    judge_accelerators,
    judge_disk,
    judge_import,
    judge_nofile,
    judge_ports,
    judge_python,
    judge_shm,
    local_part,
    visible_count,
)

ImportCache: TypeAlias = dict[tuple[str, str], CheckResult]

SHM = "/dev/shm"
PYTHON_KEY = ""  # import_cache[(python, PYTHON_KEY)] holds the interpreter check
_STDERR_TAIL = 4000
_VERSION_CODE = "import sys; print('%d.%d.%d' % sys.version_info[:3])"
_NVIDIA = re.compile(r"nvidia\d+")
_DAVINCI = re.compile(r"davinci\d+")


def run_precheck(cfg: PrecheckConfig, node: str, *,
                 import_cache: ImportCache | None = None) -> PrecheckReport:
    """Run every check on this node; pass the same `import_cache` dict to later runs on the
    same node to skip the interpreter and import subprocesses once they have passed."""
    checks: list[CheckResult] = []
    for path in cfg.paths:
        checks.append(_guard(disk_check_name(path), partial(check_disk, path, cfg)))
    checks.append(_guard(CHECK_SHM, lambda: check_shm(cfg.min_shm_mb)))
    checks.append(_guard(CHECK_ACCELERATORS, lambda: check_accelerators(cfg.expect_accelerators)))
    checks.append(_guard(CHECK_NOFILE, lambda: check_nofile(cfg.min_nofile)))
    checks.append(_guard(CHECK_PORTS, lambda: check_ports(cfg)))
    checks.extend(_python_and_imports(cfg, import_cache))
    host = ""
    with contextlib.suppress(OSError):
        host = socket.gethostname()
    return PrecheckReport(node=node, host=host, at=datetime.now(timezone.utc), checks=checks)


def _guard(name: str, check: Callable[[], CheckResult]) -> CheckResult:
    try:
        return check()
    except Exception as exc:
        return check_crashed(name, exc)


def nearest_existing(path: str) -> Path:
    """`path` itself when it exists, else its nearest existing parent. A path that can never
    exist (a NUL byte in it, a file where a directory should be) or that this process may not
    look at raises (ValueError, NotADirectoryError, PermissionError)."""
    p = Path(os.path.abspath(path))
    while True:
        try:
            os.stat(p)
            return p
        except FileNotFoundError:
            if p == p.parent:
                raise
            p = p.parent


def check_disk(path: str, cfg: PrecheckConfig) -> CheckResult:
    if not is_local_path(path):
        return CheckResult(name=disk_check_name(path), ok=True,
                           detail=f"{path}: not a local path, not checked")
    at = nearest_existing(local_part(path))
    free = shutil.disk_usage(at).free
    writable = os.access(at, os.W_OK)
    return judge_disk(path, free, cfg.min_free_disk_mb, judged_at=str(at), writable=writable)


def check_shm(min_mb: float) -> CheckResult:
    try:
        st = os.statvfs(SHM)
    except FileNotFoundError:
        return judge_shm(None, None, min_mb)
    return judge_shm(st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize, min_mb)


def count_accelerators(dev: str = "/dev") -> tuple[int, str, str]:
    """(visible, kind, source): NVIDIA GPUs (/dev/nvidiaN narrowed by CUDA_VISIBLE_DEVICES),
    else Ascend NPUs (/dev/davinciN narrowed by ASCEND_RT_VISIBLE_DEVICES)."""
    try:
        names = os.listdir(dev)
    except OSError:
        names = []
    nvidia = sum(1 for n in names if _NVIDIA.fullmatch(n))
    davinci = sum(1 for n in names if _DAVINCI.fullmatch(n))
    if nvidia or not davinci:
        nodes, kind, var, glob = nvidia, "NVIDIA GPU(s)", "CUDA_VISIBLE_DEVICES", "nvidia*"
    else:
        nodes, kind, var, glob = davinci, "Ascend NPU(s)", "ASCEND_RT_VISIBLE_DEVICES", "davinci*"
    env = os.environ.get(var)
    source = f"{dev}/{glob}: {nodes}" + (f", {var}={env!r}" if env is not None else "")
    return visible_count(nodes, env), kind, source


def check_accelerators(expected: int) -> CheckResult:
    found, kind, source = count_accelerators()
    return judge_accelerators(found, expected, kind=kind, source=source)


def check_nofile(minimum: int) -> CheckResult:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)

    def lim(n: int) -> int | None:
        return None if n == resource.RLIM_INFINITY else n

    return judge_nofile(lim(soft), lim(hard), minimum)


def check_ports(cfg: PrecheckConfig) -> CheckResult:
    """Bind every fixed port and `cfg.ports` ephemeral ones on bind_addr, all held at once
    (SO_REUSEADDR, as torch's TCPStore does, so a port in TIME_WAIT is not a failure)."""
    wanted = len(cfg.fixed_ports) + cfg.ports
    socks: list[socket.socket] = []
    bound, error = 0, None
    label = cfg.bind_addr
    try:
        family, stype, proto, _, addr = socket.getaddrinfo(
            cfg.bind_addr, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        for port in [*cfg.fixed_ports, *[0] * cfg.ports]:
            label = f"port {port}" if port else "an ephemeral port"
            s = socket.socket(family, stype, proto)
            socks.append(s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((addr[0], port, *addr[2:]))
            bound += 1
    except OSError as exc:
        error = f"{label}: {exc}"
    finally:
        for s in socks:
            s.close()
    return judge_ports(bound, wanted, error, bind_addr=cfg.bind_addr, fixed=cfg.fixed_ports)


def _run(argv: list[str], timeout_s: float) -> tuple[int | None, str, str, float]:
    """(returncode or None on timeout, stdout, stderr tail, seconds). The child gets its own
    process group, killed whole on timeout (so a grandchild cannot hold the pipes open)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, errors="replace",
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
        rc: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        rc = None
    return rc, out, err[-_STDERR_TAIL:], time.monotonic() - t0


def check_python(python: str, timeout_s: float) -> CheckResult:
    try:
        rc, out, err, _ = _run([python, "-c", _VERSION_CODE], timeout_s)
    except OSError as exc:
        return judge_python(python, None, "", error=exc.strerror or str(exc))
    return judge_python(python, rc, out if rc == 0 else err)


def check_import(python: str, module: str, timeout_s: float) -> CheckResult:
    try:
        rc, _, err, secs = _run([python, "-c", f"import {module}"], timeout_s)
    except OSError as exc:
        return judge_import(module, 127, f"cannot run {python}: {exc.strerror or exc}", 0.0,
                            python=python)
    return judge_import(module, rc, err, secs, python=python, timeout_s=timeout_s)


def _cached(cache: ImportCache | None, key: tuple[str, str],
            check: Callable[[], CheckResult]) -> CheckResult:
    hit = cache.get(key) if cache is not None else None
    if hit is not None:
        return hit.model_copy(update={"detail": f"{hit.detail} (cached)"})
    result = _guard(import_check_name(key[1]) if key[1] else CHECK_PYTHON, check)
    if cache is not None and result.ok:
        cache[key] = result
    return result


def _python_and_imports(cfg: PrecheckConfig, cache: ImportCache | None) -> list[CheckResult]:
    py, timeout = cfg.python, cfg.import_timeout_s
    interp = _cached(cache, (py, PYTHON_KEY), lambda: check_python(py, timeout))
    out = [interp]
    for module in cfg.import_modules:
        if not interp.ok:
            out.append(CheckResult(name=import_check_name(module), ok=False,
                                   detail=f"not checked: {py} cannot run", fix=interp.fix))
            continue
        out.append(_cached(cache, (py, module), partial(check_import, py, module, timeout)))
    return out
