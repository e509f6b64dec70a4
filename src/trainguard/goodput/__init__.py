"""Goodput: the step ledger, where the wall time went, and what to do about it.

`ledger` is the pure accounting; `read` builds its input from a job store; `interval` the
checkpoint-interval advice; `metrics` the Prometheus exposition; `report` the one-page text.
"""

from trainguard.goodput.ledger import CAUSES, PRODUCTIVE, Goodput, account
from trainguard.goodput.read import job_goodput

__all__ = ["CAUSES", "PRODUCTIVE", "Goodput", "account", "job_goodput"]
