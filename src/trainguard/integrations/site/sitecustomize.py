"""trainguard's site hook for `trainguard run --auto-resume` (trainguard.integrations.autoresume).

Python imports the first sitecustomize on sys.path: after installing trainguard's hook this
one runs the next one found, if any, so that a site's own customisation still happens."""

import importlib.util
import os
import sys

try:
    from trainguard.integrations.autoresume import install

    install()
except Exception as e:  # never stop the user's script: resume just will not be automatic
    print(f"[trainguard] auto-resume hook not installed: {e!r}", file=sys.stderr)

_here = os.path.dirname(os.path.abspath(__file__))
for _entry in sys.path:
    if _entry and os.path.abspath(_entry) != _here:
        _path = os.path.join(_entry, "sitecustomize.py")
        if os.path.isfile(_path):
            _spec = importlib.util.spec_from_file_location("_site_sitecustomize", _path)
            if _spec is not None and _spec.loader is not None:
                _spec.loader.exec_module(importlib.util.module_from_spec(_spec))
            break
