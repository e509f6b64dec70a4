"""Accelerator utilisation for hang detection: NVIDIA GPUs through NVML (nvidia-ml-py),
Ascend NPUs through `npu-smi`. Skipped cleanly where there is neither (this is read once;
a machine without the library or the tool costs nothing after that).

Utilisation is a second opinion only: NCCL kernels spin at 100% while a collective hangs,
so a busy accelerator is not life; a *varying* one is (hang/detector.py).
"""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
import subprocess
import threading
import time
from typing import Any

log = logging.getLogger(__name__)

_NPU_USAGE = re.compile(r"Aicore Usage Rate\(%\)\s*:\s*(\d+)", re.IGNORECASE)


class Accelerators:
    """Utilisation (0-100) per device index, or {} when none can be read."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._handles: list[Any] = []
        self._npu_smi: str | None = None
        self._npus: int = 0
        with contextlib.suppress(Exception):
            import pynvml

            pynvml.nvmlInit()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i)
                             for i in range(pynvml.nvmlDeviceGetCount())]
            self._nvml = pynvml
        if not self._handles:
            self._npu_smi = shutil.which("npu-smi")
        self.kind = "gpu" if self._handles else ("npu" if self._npu_smi else None)

    def utilisation(self) -> dict[int, int]:
        if self._nvml is not None:
            out = {}
            for i, h in enumerate(self._handles):
                with contextlib.suppress(Exception):
                    out[i] = int(self._nvml.nvmlDeviceGetUtilizationRates(h).gpu)
            return out
        if self._npu_smi is not None:
            return self._npu_usage()
        return {}

    def _npu_usage(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for i in range(8):
            try:
                text = subprocess.run([self._npu_smi or "npu-smi", "info", "-t", "usages",
                                       "-i", str(i)], capture_output=True, text=True,
                                      timeout=2, check=False).stdout
            except (OSError, subprocess.TimeoutExpired):
                break
            m = _NPU_USAGE.search(text)
            if m is None:
                break
            out[i] = int(m.group(1))
        return out


class AcceleratorSampler:
    """Reads utilisation in a thread every `every_s` (npu-smi can take seconds, and must never
    stall the agent's poll); `latest()` returns the last reading at once."""

    def __init__(self, every_s: float = 2.0) -> None:
        self._every = every_s
        self._latest: dict[int, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def latest(self) -> dict[int, int]:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="trainguard-accel",
                                            daemon=True)
            self._thread.start()
        with self._lock:
            return dict(self._latest)

    def _run(self) -> None:
        acc = Accelerators()
        if acc.kind is None:
            return  # nothing to read on this machine: the thread ends here
        while not self._stop.is_set():
            t = time.monotonic()
            util = acc.utilisation()
            with self._lock:
                self._latest = util
            self._stop.wait(max(self._every - (time.monotonic() - t), 0.1))

    def close(self) -> None:
        self._stop.set()
