"""Room kept on the job store's disk for the job's last word.

A job whose job-dir disk fills up while it runs goes on (the recorder keeps what it cannot
write and tries again), but its end must still be written: a job that succeeded on a full
disk read `lost` at the step the disk filled (walk-through 24), and `trainguard run` again
would have trained it twice. The launcher keeps a file of RESERVE_BYTES, its blocks
allocated, beside the store while the job runs, and removes it before the job's final
writes when writes have been failing (and always once the job has ended).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from trainguard.paths import RESERVE_NAME

RESERVE_BYTES = 8 << 20  # the end, the records and thousands of waiting events


class Reserve:
    def __init__(self, job_dir: Path, nbytes: int = RESERVE_BYTES) -> None:
        self.path = job_dir / RESERVE_NAME
        self.nbytes = nbytes

    def keep(self) -> bool:
        """Allocate the room (real blocks: posix_fallocate, not a sparse file); False when
        the disk has not even that (the job runs without it)."""
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.posix_fallocate(fd, 0, self.nbytes)
            finally:
                os.close(fd)
        except OSError:
            self.release()
            return False
        return True

    def release(self) -> None:
        """Give the room back to the disk (for the writes that follow)."""
        with contextlib.suppress(OSError):
            self.path.unlink()


def no_room(job_dir: Path, nbytes: int = RESERVE_BYTES) -> str:
    """What a launch says when the room could not be kept (walk-through 40 #6: a job on a
    disk with 196 KiB free started without a word and, its end unrecorded, read `lost`)."""
    return (f"the disk of {job_dir} has less than {nbytes >> 20} MiB free: the room kept for "
            "the job's last writes could not be allocated, so should the disk fill up, the "
            "job's end may not be recorded (`status` would read it lost). Fix: free space "
            "there, or launch with another --job-dir")
