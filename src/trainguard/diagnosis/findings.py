"""What a scan finds in a log: error-looking lines, Python exceptions, exit notices. Pure.

A Finding is small and serialisable: a node's agent scans its ranks' logs and sends the
findings to the controller, which decides (verdict.py).
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict

from trainguard.diagnosis.taxonomy import Evidence

# Finding.recovered: the kind of a rank's recovery line (worker.contract.RECOVERY_PATTERN)
REEXECUTED = "re-executed"  # a step ran again on every rank: proof by itself
REENTERED = "re-entered"  # a survivor of an in-process restart re-enters its function
STARTED = "started"  # a replacement of an in-process restart starts


class Finding(BaseModel):
    model_config = ConfigDict(frozen=True)

    file: str
    line: int  # 1-based line number in `file`
    offset: int  # byte offset of the line in `file` (orders lines of one file)
    text: str  # the line without launcher/rank prefixes, cut to MAX_TEXT characters
    rank: int | None = None
    node: str | None = None
    at: datetime | None = None  # when written/read: launcher stamp, else the line's own time
    at_inherited: bool = False  # `at` comes from an earlier line of the same file
    rule: str | None = None  # id of the first rule matching the line
    # Python exceptions: the `Type: message` line that ends a traceback (or stands alone)
    exc_type: str | None = None
    traceback: bool = False  # the exception line ends a parsed traceback
    frame: str | None = None  # deepest frame in user code, "train.py:88 in forward"
    library_frame: bool = False  # the deepest frame is inside a library
    checkpoint_load: bool = False  # raised while loading a checkpoint (by its frames)
    config_build: bool = False  # raised by a registry building what a config names
    more: tuple[str, ...] = ()  # the next lines of an exception's message, when it spans lines
    chain: int | None = None  # traceback chain index in its stream (chained exceptions share)
    final: bool = False  # the last exception chain of its stream: what the process died of
    # exit notices printed by launchers/shells ("exitcode: -9", "task 3: Killed")
    returncode: int | None = None
    # one of the file's last lines that no rule or exception picked: read only by the
    # fallback (diagnosis/fallback.py) when the rules are silent or weak
    context: bool = False
    # trainguard's line where the rank recovered in place (lines.recovery): no failure
    # but a mark: REEXECUTED, REENTERED or STARTED; diagnosis/survived.py reads it
    recovered: str | None = None

    def evidence(self) -> Evidence:
        """The line as the evidence of a diagnosis (its time only when the line had its own)."""
        return Evidence(self.file, self.line, self.text, self.rank,
                        None if self.at_inherited else self.at, more=self.more)
