"""Accelerator utilisation: read where a library or tool is there, skipped cleanly where not."""

from __future__ import annotations

import pytest

from trainguard.node import accelerators
from trainguard.node.accelerators import Accelerators


def test_without_nvml_or_npu_smi_there_is_nothing_to_read(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    monkeypatch.setattr(accelerators.shutil, "which", lambda name: None)
    acc = Accelerators()  # this machine has no NVIDIA driver: nvmlInit fails, quietly
    if acc.kind == "gpu":  # pragma: no cover - a machine with a GPU
        assert set(acc.utilisation()) == set(range(len(acc.utilisation())))
        return
    assert acc.kind is None and acc.utilisation() == {}


def test_npu_smi_usage_is_parsed(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    """A stand-in `npu-smi` that prints what the real one prints for `info -t usages`."""
    import pathlib

    fake = pathlib.Path(str(tmp_path)) / "npu-smi"
    fake.write_text("#!/bin/sh\n"
                    'if [ "$5" -lt 2 ]; then\n'
                    '  echo "        Aicore Usage Rate(%)           : $((40 + $5))"\n'
                    "fi\n")
    fake.chmod(0o755)
    monkeypatch.setattr(accelerators.shutil, "which", lambda name: str(fake))
    acc = Accelerators()
    if acc.kind == "gpu":  # pragma: no cover - NVML wins where there is a GPU
        return
    assert acc.kind == "npu" and acc.utilisation() == {0: 40, 1: 41}
