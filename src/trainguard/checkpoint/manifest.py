"""What makes a checkpoint valid, and which ones to keep. Pure: no I/O, no torch.

A checkpoint is the directory `step-<N>` under the location. It is valid when its
`manifest.json` is present and every file it lists is there with the listed size and
SHA-256. The manifest is written last, after every rank's files are durable.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

FORMAT = "trainguard-checkpoint/1"
MANIFEST = "manifest.json"
LATEST = "latest"
REPLICATED = "replicated.pt"
# in a --checkpoint-dir (or --log-dir) not under its job dir: which job launched into it last,
# `{"run_id", "job_dir", "host", "pid", "at"}` (controller/dir_owner.py writes it; a save's
# prune reads it: checkpoint/sharing.py)
OWNER_NAME = ".trainguard-job"
_STEP_DIR = re.compile(r"^step-(\d{9,})$")


def step_dir(step: int) -> str:
    return f"step-{step:09d}"


def parse_step_dir(name: str) -> int | None:
    m = _STEP_DIR.match(name)
    return int(m.group(1)) if m else None


def rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


def part_file(rank: int) -> str:
    """A rank's own list of the files it wrote, durable before the commit reads it."""
    return f"rank-{rank:05d}.part.json"


@dataclass(frozen=True)
class FileEntry:
    name: str
    size: int
    sha256: str
    rank: int


@dataclass(frozen=True)
class Manifest:
    step: int
    world_size: int
    files: tuple[FileEntry, ...]
    library_version: str
    created_at: float
    format: str = FORMAT
    missing_ranks: tuple[int, ...] = ()  # ranks whose own part could not be written
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> bytes:
        d = asdict(self)
        d["files"] = [asdict(f) for f in self.files]
        return json.dumps(d, indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        """Parse a manifest; ValueError (with the reason) when it is not one of ours."""
        try:
            d = json.loads(data)
            if d.get("format") != FORMAT:
                raise ValueError(f"unknown format {d.get('format')!r}")
            files = tuple(FileEntry(str(f["name"]), int(f["size"]), str(f["sha256"]),
                                    int(f["rank"])) for f in d["files"])
            return cls(step=int(d["step"]), world_size=int(d["world_size"]), files=files,
                       library_version=str(d["library_version"]),
                       created_at=float(d["created_at"]), format=FORMAT,
                       missing_ranks=tuple(int(r) for r in d.get("missing_ranks", ())),
                       extra=dict(d.get("extra") or {}))
        except (KeyError, TypeError, AttributeError, ValueError) as e:  # JSON, UTF-8, int()
            raise ValueError(f"malformed manifest ({type(e).__name__}: {e})") from None

    def entry(self, name: str) -> FileEntry | None:
        return next((f for f in self.files if f.name == name), None)


def parts_to_files(parts: dict[int, list[dict[str, Any]]]) -> tuple[FileEntry, ...]:
    """Every rank's part list -> the manifest's file entries, in a stable order."""
    out = [FileEntry(str(f["name"]), int(f["size"]), str(f["sha256"]), rank)
           for rank, files in sorted(parts.items()) for f in files]
    return tuple(sorted(out, key=lambda e: e.name))


class Status(str, Enum):
    VALID = "valid"
    INCOMPLETE = "incomplete"  # no manifest: a save that did not finish
    CORRUPT = "corrupt"  # a manifest, but a file is missing or differs from it


@dataclass(frozen=True)
class Verdict:
    step: int
    status: Status
    reason: str = ""
    # CORRUPT only because its manifest names another step, its files whole: moved or edited
    # by hand; the reason says how to put it back, so pruning keeps it (review of
    # walk-through 31 #9: the next save deleted it)
    misplaced: bool = False


def check_sizes(manifest: Manifest, sizes: dict[str, int]) -> str | None:
    """Why the files on storage (name -> size) do not match the manifest; None if they do."""
    for f in manifest.files:
        have = sizes.get(f.name)
        if have is None:
            return f"{f.name} is missing"
        if have != f.size:
            return f"{f.name} has {have} bytes, the manifest says {f.size}"
    return None


def check_step(manifest: Manifest, step: int) -> str | None:
    """Why a manifest does not belong in `step-<step>` (it names another step); None if it
    does. A manifest is valid only in its own step's directory: a loader reads the files
    where the manifest's step says (walk-through 31 #1)."""
    if manifest.step == step:
        return None
    return (f"{MANIFEST} says step {manifest.step} but lies in {step_dir(step)}: it was "
            "edited or moved by hand. Fix: move the directory back to "
            f"{step_dir(manifest.step)} (or set the manifest's step back to {step}), or "
            f"delete {step_dir(step)}")


def prune_plan(verdicts: list[Verdict], keep: int, newest_valid_in_use: int | None = None
               ) -> list[int]:
    """Steps to delete: valid ones beyond the newest `keep`, and broken ones older than the
    newest valid one, but a misplaced one (Verdict.misplaced). The newest valid checkpoint is
    never deleted."""
    valid = sorted((v.step for v in verdicts if v.status == Status.VALID), reverse=True)
    if not valid:
        return []
    kept = set(valid[:max(keep, 1)])
    if newest_valid_in_use is not None:
        kept.add(newest_valid_in_use)
    newest = valid[0]
    doomed = [s for s in valid if s not in kept]
    doomed += [v.step for v in verdicts
               if v.status != Status.VALID and not v.misplaced and v.step < newest]
    return sorted(doomed)
