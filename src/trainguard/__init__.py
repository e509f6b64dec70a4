"""trainguard: keeps distributed PyTorch training jobs alive.

Importing this package is cheap (standard library only) and never imports the launcher
side, so training scripts can use `trainguard.worker` and `trainguard.testing` freely.
For the script itself: `trainguard.progress(step)` every step and
`with trainguard.phase("eval", timeout_s=...)` around work that is slow on purpose let the
launcher tell a slow job from a hung one (see trainguard.worker.progress);
`trainguard.log_metrics(step, loss=..., learning_rate=...)` puts them in the job's metrics.
`trainguard.run_resilient(main)` lets the launcher restart a rank in place: when a peer
dies or hangs, only that peer starts again and the other ranks re-enter `main` in their
own processes (see trainguard.worker.resilient).
"""

__version__ = "0.1.0"

from trainguard.worker.progress import log_metrics, phase, progress
from trainguard.worker.resilient import run_resilient

__all__ = ["__version__", "log_metrics", "phase", "progress", "run_resilient"]
