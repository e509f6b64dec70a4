"""trainguard: keeps distributed PyTorch training jobs alive.

Importing this package is cheap (standard library only) and never imports the launcher
side, so training scripts can use `trainguard.worker` and `trainguard.testing` freely.
For the script itself: `trainguard.progress(step)` every step and
`with trainguard.phase("eval", timeout_s=...)` around work that is slow on purpose let the
launcher tell a slow job from a hung one (see trainguard.worker.progress).
"""

__version__ = "0.1.0"

from trainguard.worker.progress import phase, progress

__all__ = ["__version__", "phase", "progress"]
