"""`trainguard ckpt` for the checkpoints a trainer integration committed (HF Trainer's
`checkpoint-N` dirs, Lightning's `.ckpt` files): not trainguard.checkpoint's format, so the
step listing finds none, and `ckpt ls JOB_DIR` of an HF job said "no checkpoints" while it
had committed several (walk-through 29). Their commit markers record each file's size (not a
checksum): a row is `valid` while every file is there at its committed size, `damaged`
otherwise, as a resume reads them (integrations/common.py)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from trainguard.cli.ckpt_verdict import VALID
from trainguard.controller.store import JobStore, db_path
from trainguard.errors import StoreError
from trainguard.integrations.common import (
    COMMIT_MARKER,
    checkpoint_files,
    checkpoints_under,
    commit_time,
    damage,
    file_commit,
    file_damage,
    file_marker,
    file_sizes,
    is_committed,
    mtime,
    numbered_dirs,
)

HF_DIR = r"checkpoint-(\d+)"


def trainer_dirs(location: str, job_dir: Path | None) -> list[Path]:
    """Where to look: the folders of the job's CheckpointSaved events (a job dir given), or
    the location itself."""
    found: list[Path] = []
    if job_dir is not None and db_path(job_dir).is_file():
        try:
            with JobStore.open(job_dir) as store:
                saved = [ev for _, ev in store.events(reasons=("CheckpointSaved",))]
        except StoreError:
            saved = []
        for ev in saved:
            where = (ev.data or {}).get("location")
            if isinstance(where, str) and "://" not in where:
                parent = Path(where).parent
                if parent not in found:
                    found.append(parent)
    if not found and "://" not in location:  # and where Lightning saves under it, as a
        # resume looks (walk-through 39 #10: a default_root_dir showed none)
        found += [Path(location), *checkpoints_under(Path(location))]
    return [d for d in found if d.is_dir()]


def unmarked(location: str) -> str:
    """What a location with no committed checkpoint holds all the same: checkpoints a
    trainer wrote with no commit marker (a script run without the integration; walk-through
    39 #6: `ckpt ls` said "no checkpoints" of six checkpoint-N dirs), there or where
    Lightning saves under it; '' when none."""
    if "://" in location:
        return ""
    dirs = [Path(location), *checkpoints_under(Path(location))]
    found = sum(len(numbered_dirs(d, HF_DIR)) + len(checkpoint_files(d, ".ckpt")) for d in dirs)
    return "" if not found else (
        f" committed by trainguard ({found} trainer checkpoint(s) there with no commit marker: "
        "written without a trainguard integration, so nothing vouches for them; a resume "
        "under --auto-resume hf|lightning takes the newest complete one while none there is "
        "marked: docs/integrations.md)")


def trainer_rows(dirs: list[Path]) -> list[dict[str, Any]]:
    """The committed checkpoints under `dirs`, newest step first."""
    rows: list[dict[str, Any]] = []
    for d in dirs:
        for step, ckpt in numbered_dirs(d, HF_DIR):
            if (ckpt / COMMIT_MARKER).exists():
                why = damage(ckpt) if is_committed(ckpt) else "its commit marker is unreadable"
                sizes = file_sizes(ckpt)
                rows.append(_row(step, ckpt, why, sizes))
        for f in checkpoint_files(d, ".ckpt"):
            if file_marker(f).exists():
                commit = file_commit(f)
                size = {f.name: f.stat().st_size}
                rows.append(_row(-1, f, "its commit marker is unreadable", size)
                            if commit is None else
                            _row(commit[0], f, file_damage(f, commit[1]), size))
    rows.sort(key=lambda r: (r["step"], r["path"]), reverse=True)
    valid = [r for r in rows if r["status"] == VALID]
    if valid:  # the one a resume takes: the highest step, the latest written among equals
        # (walk-through 39 #9: every row said false; review 47 #7: a tie went by name)
        max(valid, key=lambda r: (r["step"], mtime(Path(r["path"]))))["latest"] = True
    return rows


def _row(step: int, path: Path, why: str | None, sizes: dict[str, int]) -> dict[str, Any]:
    """Every key a trainguard.checkpoint row has (cli.md: a consumer reads them all; null
    where the format does not know: the world size; `latest`: set on the newest valid one,
    the one a resume takes, by trainer_rows) and
    where the checkpoint is (`path`; `format`: a directory or a file). Walk-through 35 F4."""
    return {"step": step, "status": VALID if why is None else "damaged", "reason": why,
            "latest": False, "world_size": None, "files": len(sizes),
            "bytes": sum(sizes.values()), "created_at": _committed_at(path),
            "path": str(path), "format": "dir" if path.is_dir() else "file"}


def _committed_at(path: Path) -> str | None:
    """When the checkpoint was committed (commit_time: what a resume's warning reads), as the
    manifest's `created_at` reads: ISO 8601, UTC, seconds."""
    when = commit_time(path)
    return None if when is None else (
        datetime.fromtimestamp(when, timezone.utc).isoformat(timespec="seconds"))


def show_trainer_rows(rows: list[dict[str, Any]], location: str, as_json: bool) -> None:
    """The rows as `ckpt ls|verify` prints them (the verdict is ckpt_verdict's)."""
    from trainguard.cli.fmt import print_table, size_text

    if as_json:
        print(json.dumps(rows, indent=2))
        return
    from rich.table import Table

    t = Table(title=f"{location}: checkpoints committed by a trainer integration",
              title_justify="left", box=None)
    for col in ("STEP", "STATUS", "SIZE", "PATH", "REASON"):
        t.add_column(col)
    colour = {"valid": "green", "damaged": "red"}
    for r in rows:
        t.add_row(str(r["step"]), f"[{colour[r['status']]}]{r['status']}",
                  size_text(r["bytes"]), r["path"], r["reason"] or "")
    print_table(t)
    print("HF Trainer / Lightning checkpoints (not trainguard.checkpoint's format): each\n"
          "file checked against the size its commit marker recorded (no checksums); a "
          "resume\ntakes the newest valid one")
