"""trainguard: keeps distributed PyTorch training jobs alive.

Importing this package is cheap and never imports the launcher side, so training
scripts can use `trainguard.worker` and `trainguard.testing` freely.
"""

__version__ = "0.1.0"
