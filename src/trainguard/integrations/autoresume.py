"""The `trainguard run --auto-resume hf|lightning` site hook: patch the framework's entry
point as soon as the script imports it, so that an unmodified script resumes from the newest
committed checkpoint and reports progress.

The launcher puts integrations/site (whose sitecustomize.py calls `install()`) first on the
workers' PYTHONPATH and sets TRAINGUARD_AUTO_RESUME. Nothing is imported ahead: a finder on
sys.meta_path waits for the framework's module and patches it right after it loads.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from trainguard.integrations.common import ENV_AUTO_RESUME
from trainguard.worker import channel
from trainguard.worker.contract import MessageKind

# framework -> (the module whose loading triggers the patch, the patching function)
TARGETS = {"hf": ("transformers.trainer", "trainguard.integrations.hf"),
           "lightning": ("pytorch_lightning.trainer.trainer",
                         "trainguard.integrations.lightning")}


# framework -> the modules whose Trainer, when the script runs it, shows that the script
# trains with the other framework (a wrong flag), and that Trainer's entry point
OTHERS = {"hf": (("pytorch_lightning.trainer.trainer", "lightning.pytorch.trainer.trainer"),
                 "fit"),
          "lightning": (("transformers.trainer",), "train")}
FLAGS = {"hf": "transformers' Trainer", "lightning": "Lightning's Trainer"}
_WARNS = "__trainguard_warns__"


def warn_when_run(module: ModuleType, framework: str) -> None:
    """Wrap the other framework's Trainer entry point (OTHERS) in `module` to say, the first
    time the script calls it, that --auto-resume `framework` does not patch it: on the
    rank's stderr and as an AutoResumeUnused event (walk-through 25, 39 #12). Said when
    run, not when imported (review 48 #2: an HF script importing Lightning's
    seed_everything loads its Trainer module, and was told nothing resumes it while its
    transformers Trainer did)."""
    entry = OTHERS[framework][1]
    cls = getattr(module, "Trainer", None)
    original = getattr(cls, entry, None)
    if cls is None or original is None or getattr(original, _WARNS, False):
        return
    other = "lightning" if framework == "hf" else "hf"
    said: list[bool] = []

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not said:
            said.append(True)
            why = (f"--auto-resume {framework} is on, but this script trains with "
                   f"{FLAGS[other]} ({module.__name__}.Trainer.{entry}), which it does not "
                   f"patch: nothing resumes it from a checkpoint. Fix: run with --auto-resume "
                   f"{other}")
            print(f"[trainguard] {why}", file=sys.stderr, flush=True)
            channel.send(MessageKind.AUTO_RESUME_UNUSED, why=why)  # an event (walk-through 39)
        return original(*args, **kwargs)

    setattr(wrapper, _WARNS, True)
    setattr(cls, entry, wrapper)


class _AfterLoad(importlib.abc.MetaPathFinder):
    """Runs `then(module)` right after one of `modules` loads (once each); finds no module
    itself: the other finders do."""

    def __init__(self, modules: Sequence[str], then: Callable[[ModuleType], None]) -> None:
        self.modules, self.then = set(modules), then

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.modules:
            return None
        self.modules.discard(fullname)
        sys.meta_path.remove(self)  # find the real spec with the other finders
        try:
            spec: importlib.machinery.ModuleSpec | None = importlib.util.find_spec(fullname)
        finally:
            if self.modules:
                sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader, then = spec.loader, self.then

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec: Any) -> ModuleType | None:
                made: ModuleType | None = loader.create_module(spec)
                return made

            def exec_module(self, module: ModuleType) -> None:
                loader.exec_module(module)
                then(module)

        spec.loader = _Loader()
        return spec


def install() -> None:
    """Patch the framework named by TRAINGUARD_AUTO_RESUME (now if already imported), and
    watch for the other framework's Trainer being run."""
    framework = os.environ.get(ENV_AUTO_RESUME, "")
    if framework not in TARGETS:
        return
    module, patcher = TARGETS[framework]
    others = OTHERS[framework][0] if framework in OTHERS else ()
    for name in others:
        if name in sys.modules:
            warn_when_run(sys.modules[name], framework)
    unloaded = [n for n in others if n not in sys.modules]
    if unloaded:
        sys.meta_path.insert(0, _AfterLoad(unloaded, lambda m: warn_when_run(m, framework)))
    if module in sys.modules:
        importlib.import_module(patcher).patch()
        return
    sys.meta_path.insert(0, _AfterLoad([module],
                                       lambda _: importlib.import_module(patcher).patch()))


def site_dir() -> str:
    """The directory to put first on the workers' PYTHONPATH."""
    return os.path.join(os.path.dirname(__file__), "site")
