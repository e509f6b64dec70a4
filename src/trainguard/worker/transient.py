"""Which errors in a training step are transient collective failures. Stdlib only.

A broken peer connection, a collective or store timeout (gloo, NCCL, c10d): a re-formed
process group may not see it again, so StepGuard re-executes the step and run_resilient
waits for the launcher's in-process restart. Anything else is the script's own error and is
raised at once.
"""

from __future__ import annotations

# the words of a transient collective failure (gloo, NCCL, c10d)
TRANSIENT_MARKS = ("connection closed by peer", "connection reset by peer", "broken pipe",
                   "connection refused", "timed out", "timeout", "ncclsystemerror",
                   "ncclremoteerror", "ncclinternalerror", "nccl error", "unhandled system error",
                   "socket closed", "read error", "write error", "end of file")
# torch.distributed's own error classes (all RuntimeErrors), matched by name: no torch import
DIST_NETWORK_ERRORS = ("DistNetworkError",)


def is_transient(e: BaseException) -> bool:
    """Whether `e` is a collective failure that a re-formed group may not see again."""
    if any(c.__name__ in DIST_NETWORK_ERRORS for c in type(e).__mro__):
        return True
    if not isinstance(e, RuntimeError):  # DistBackendError and DistStoreError included
        return False
    text = str(e).lower()
    return any(m in text for m in TRANSIENT_MARKS)
