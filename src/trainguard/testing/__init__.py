"""Helpers for testing trainguard and the jobs it runs (fault injection: `faults`)."""
