"""Errors trainguard raises, each message carrying the values involved and the fix.

    TrainguardError
    ├── SpecError        a flag, job file key or value is wrong (names the key and the fix)
    ├── StoreError       the job store cannot be created, opened or read
    ├── LaunchError      workers could not be started (bad command, no free port...)
    ├── RulesError       a failure-signature rules file is invalid (names the rule and key)
    └── DiagnoseError    `trainguard diagnose` found nothing it could read
"""

from __future__ import annotations


class TrainguardError(Exception):
    """Base of every error trainguard raises on purpose."""


class SpecError(TrainguardError):
    """A job specification error: `key` is the flag or job-file key, `fix` what to do."""

    def __init__(self, key: str, problem: str, fix: str) -> None:
        self.key = key
        self.problem = problem
        self.fix = fix
        super().__init__(f"{key}: {problem}. Fix: {fix}")


class StoreError(TrainguardError):
    """The job store is missing, unreadable or of an unknown version."""


class LaunchError(TrainguardError):
    """Workers could not be started."""


class NodesUnavailable(LaunchError):
    """Not enough healthy nodes to start an attempt (a fault of the cluster, not of usage)."""


class RulesError(TrainguardError):
    """A rules file (diagnosis signatures) is not valid."""


class DiagnoseError(TrainguardError):
    """Nothing could be read: the message names the paths and what to pass instead."""
