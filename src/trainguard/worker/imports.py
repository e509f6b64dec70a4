"""What a worker imported from installed packages: the standby workers import it ahead.

Sent once per process (MessageKind.IMPORTS) by the checkpoint library's load_latest, when
the script's imports are done and training is about to begin; the node agent's standby
pool adds these to what its next standbys import (node/standby.py). Stdlib only.
"""

from __future__ import annotations

import sys

from trainguard.worker import channel
from trainguard.worker.contract import MessageKind

MAX_MODULES = 64
_SKIP = ("torch", "trainguard", "_")  # imported by every standby already, or private
_sent: list[bool] = []


def installed_imports() -> list[str]:
    """Top-level packages from site-packages / dist-packages now in sys.modules."""
    roots = tuple(p for p in sys.path if p.endswith(("site-packages", "dist-packages")))
    names = set()
    for name, module in list(sys.modules.items()):
        top = name.partition(".")[0]
        where = getattr(module, "__file__", None) or ""
        if roots and where.startswith(roots) and top.isidentifier() \
                and not top.startswith(_SKIP):
            names.add(top)
    return sorted(names)[:MAX_MODULES]


def report_once() -> None:
    if _sent or not channel.available():
        return
    _sent.append(True)
    modules = installed_imports()
    if modules:
        channel.send(MessageKind.IMPORTS, modules=",".join(modules))
