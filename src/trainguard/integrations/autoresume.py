"""The `trainguard run --auto-resume hf|lightning` site hook: patch the framework's entry
point as soon as the script imports it, so that an unmodified script resumes from the newest
committed checkpoint and reports progress.

The launcher puts integrations/site (whose sitecustomize.py calls `install()`) first on the
workers' PYTHONPATH and sets TRAINGUARD_AUTO_RESUME. Nothing is imported ahead: a finder on
sys.meta_path waits for the framework's module and patches it right after it loads.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from trainguard.integrations.common import ENV_AUTO_RESUME
from trainguard.worker import channel
from trainguard.worker.contract import MessageKind

# framework -> (the module whose loading triggers the patch, the patching function)
TARGETS = {"hf": ("transformers.trainer", "trainguard.integrations.hf"),
           "lightning": ("pytorch_lightning.trainer.trainer",
                         "trainguard.integrations.lightning")}


# framework -> the modules that show the script trains with the other one (a wrong flag)
OTHERS = {"hf": ("pytorch_lightning.trainer.trainer", "lightning.pytorch.trainer.trainer"),
          "lightning": ("transformers.trainer",)}
FLAGS = {"hf": "transformers' Trainer", "lightning": "Lightning's Trainer"}


class _WrongFramework(importlib.abc.MetaPathFinder):
    """Says once, on the rank's stderr, that the script loads the other framework's Trainer:
    `--auto-resume hf` on a Lightning script resumed nothing and said nothing
    (walk-through 25). Finds no module itself."""

    def __init__(self, framework: str) -> None:
        self.framework = framework

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname in OTHERS.get(self.framework, ()):
            sys.meta_path.remove(self)
            other = "lightning" if self.framework == "hf" else "hf"
            why = (f"--auto-resume {self.framework} is on, but this script loads "
                   f"{FLAGS[other]} ({fullname}), which it does not patch: nothing resumes it "
                   f"from a checkpoint. Fix: run with --auto-resume {other}")
            print(f"[trainguard] {why}", file=sys.stderr, flush=True)
            channel.send(MessageKind.AUTO_RESUME_UNUSED, why=why)  # an event (walk-through 39)
        return None


class _PatchAfterLoad(importlib.abc.MetaPathFinder):
    def __init__(self, module: str, patcher: str) -> None:
        self.module, self.patcher = module, patcher

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.module:
            return None
        sys.meta_path.remove(self)  # find the real spec with the other finders
        try:
            spec: importlib.machinery.ModuleSpec | None = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader, patcher = spec.loader, self.patcher

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec: Any) -> ModuleType | None:
                made: ModuleType | None = loader.create_module(spec)
                return made

            def exec_module(self, module: ModuleType) -> None:
                loader.exec_module(module)
                importlib.import_module(patcher).patch()

        spec.loader = _Loader()
        return spec


def install() -> None:
    """Patch the framework named by TRAINGUARD_AUTO_RESUME (now if already imported)."""
    framework = os.environ.get(ENV_AUTO_RESUME, "")
    if framework not in TARGETS:
        return
    module, patcher = TARGETS[framework]
    sys.meta_path.insert(0, _WrongFramework(framework))
    if module in sys.modules:
        importlib.import_module(patcher).patch()
        return
    sys.meta_path.insert(0, _PatchAfterLoad(module, patcher))


def site_dir() -> str:
    """The directory to put first on the workers' PYTHONPATH."""
    return os.path.join(os.path.dirname(__file__), "site")
