"""`trainguard ckpt ls|verify LOCATION`: what is at a checkpoint location, and is it valid.

LOCATION is a job dir (its checkpoints), a directory or an fsspec URL (s3://bucket/prefix).
For S3-compatible servers set AWS_ENDPOINT_URL (and AWS_ACCESS_KEY_ID /
AWS_SECRET_ACCESS_KEY), or pass `--storage-option client_kwargs.endpoint_url=http://...`
style options.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.table import Table

from trainguard.checkpoint.manifest import LATEST, Status, step_dir
from trainguard.cli.fmt import plural, print_table, size_text
from trainguard.controller.store import JobStore, db_path
from trainguard.errors import SpecError, StoreError
from trainguard.exitcodes import ExitCode
from trainguard.paths import is_url

if TYPE_CHECKING:
    from trainguard.checkpoint.storage import Storage


def add_ckpt_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("ckpt", help="list or verify checkpoints at a location")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    for verb, text in (("ls", "list checkpoints with their status (sizes checked)"),
                       ("verify", "check every file's checksum; exit 1 if the newest is bad")):
        v = verbs.add_parser(verb, help=text, description=text)
        v.add_argument("location", help="job dir (its checkpoints), checkpoint directory or "
                       "fsspec URL")
        v.add_argument("--json", action="store_true", help="print JSON")
        v.add_argument("--storage-option", "-o", action="append", default=[],
                       metavar="KEY=VALUE", help="fsspec storage option (repeatable)")
        if verb == "verify":
            v.add_argument("--step", type=int, help="verify only this step")
        v.set_defaults(func=_run)


def storage_options(pairs: list[str]) -> dict[str, Any]:
    """`a.b=c` -> {"a": {"b": "c"}} (values parsed as JSON when they are JSON)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise SpecError("--storage-option", f"{pair!r} is not KEY=VALUE",
                            "e.g. -o client_kwargs.endpoint_url=http://127.0.0.1:9000")
        try:
            value: Any = json.loads(raw)
        except ValueError:
            value = raw
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def describe(st: Storage, step: int, full: bool) -> dict[str, Any]:
    from trainguard.checkpoint.saving import quick_verdict  # torch: only for this command

    verdict, manifest = quick_verdict(st, step)
    status, reason = verdict.status, verdict.reason
    if full and status == Status.VALID and manifest is not None:
        for f in manifest.files:
            if st.sha256(f"{step_dir(step)}/{f.name}") != f.sha256:
                status, reason = Status.CORRUPT, f"{f.name}: checksum differs from the manifest"
                break
    doc: dict[str, Any] = {"step": step, "status": status.value, "reason": reason or None}
    if manifest is not None:
        created = datetime.fromtimestamp(manifest.created_at, timezone.utc)
        doc.update(world_size=manifest.world_size, files=len(manifest.files),
                   bytes=sum(f.size for f in manifest.files),
                   created_at=created.isoformat(timespec="seconds"))
    return doc


def checkpoint_location(location: str) -> str:
    """A job dir stands for its checkpoints (where its store says, or JOB_DIR/checkpoints);
    a local path that is not there is an error, not "no checkpoints"."""
    if is_url(location):
        return location
    path = Path(location)
    if not path.exists():
        raise SpecError("LOCATION", f"{location} does not exist",
                        "give a job dir, a checkpoint directory or an fsspec URL "
                        "(s3://bucket/prefix)")
    if not db_path(path).is_file():
        return location
    try:
        with JobStore.open(path) as store:
            recorded = store.meta().get("checkpoint_dir")
    except StoreError:
        recorded = None
    return str(recorded) if recorded else str(path / "checkpoints")


def _run(ns: argparse.Namespace) -> int:
    ns.location = checkpoint_location(ns.location)
    try:
        return _list(ns)
    except (SpecError, KeyboardInterrupt):
        raise
    except Exception as e:  # the storage layer's errors (fsspec, botocore...) reach users
        print(f"trainguard ckpt: cannot read {ns.location}: {type(e).__name__}: {e}. Fix: "
              "check the path or URL, and credentials / AWS_ENDPOINT_URL for object stores",
              file=sys.stderr)
        return ExitCode.UNREADABLE


def _list(ns: argparse.Namespace) -> int:
    from trainguard.checkpoint.storage import Storage  # fsspec: only for this command

    st = Storage(ns.location, storage_options(ns.storage_option))
    steps = st.steps()
    if ns.verb == "verify" and ns.step is not None:
        if ns.step not in steps:
            there = ", ".join(map(str, steps)) if steps else "none"
            print(f"trainguard ckpt verify: step {ns.step} is not at {ns.location} "
                  f"(steps there: {there}). Fix: pass one of those to --step, or leave --step "
                  "out to verify every step", file=sys.stderr)
            return ExitCode.NOT_VALID
        steps = [ns.step]
    docs = [describe(st, s, full=ns.verb == "verify") for s in steps]
    latest = st.read_bytes(LATEST).decode(errors="replace").strip() if st.exists(LATEST) else None
    for d in docs:
        d["latest"] = latest == step_dir(d["step"])
    if ns.json:
        print(json.dumps(docs, indent=2))
    else:
        _table(ns.location, docs)
    if ns.verb == "verify":
        if not docs:
            print(f"trainguard ckpt verify: no checkpoint at {ns.location}", file=sys.stderr)
            return ExitCode.NOT_VALID
        if docs[0]["status"] != Status.VALID.value:
            return ExitCode.NOT_VALID
        if not ns.json:
            print(f"step {docs[0]['step']} is valid: {plural(docs[0].get('files', 0), 'data file')}"
                  ", every checksum matches the manifest")
    return ExitCode.SUCCESS


DATA_FILES_NOTE = ("DATA FILES and SIZE: the files the manifest lists with their checksums\n"
                   "(ranks' state, replicated state, shards; not manifest.json; - without one)")


def _table(location: str, docs: list[dict[str, Any]]) -> None:
    if not docs:
        print(f"no checkpoints at {location}")
        return
    t = Table(title=location, title_justify="left", box=None)
    for col in ("STEP", "STATUS", "LATEST", "WORLD", "DATA FILES", "SIZE", "CREATED", "REASON"):
        t.add_column(col)
    colour = {"valid": "green", "incomplete": "yellow", "corrupt": "red"}
    for d in docs:
        size = size_text(d["bytes"]) if "bytes" in d else "-"
        t.add_row(str(d["step"]), f"[{colour[d['status']]}]{d['status']}",
                  "*" if d["latest"] else "", str(d.get("world_size", "-")),
                  str(d.get("files", "-")), size, d.get("created_at", "-"), d["reason"] or "")
    print_table(t)
    print(DATA_FILES_NOTE)
