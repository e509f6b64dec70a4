"""The note a restart carries when trainguard knows nothing it resumes from (walk-through 39
#6): a memory snapshot the ranks took counts, the --memory-every setting alone does not
(review 49 #8: a plain script under the llm preset, which takes none, got no note)."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from trainguard.controller.recorder import Recorder
from trainguard.controller.start import resume_note
from trainguard.controller.store import JobStore
from trainguard.paths import JobPaths
from trainguard.protocol import WorkerMessage
from trainguard.spec_build import build_spec
from trainguard.worker.contract import MessageKind


def test_a_restart_says_the_script_starts_again_until_a_rank_took_a_snapshot(
        tmp_path: Path) -> None:
    spec = build_spec(None, {"entrypoint": "train.py", "run_id": "r", "scenario": "llm"})
    assert spec.memory_every > 0  # the preset's setting
    job = tmp_path / "job"
    paths = JobPaths(job, job / "logs", str(job / "ck"))
    paths.make()
    with JobStore.create(job, "r") as store:
        rec = Recorder(spec, paths, store, ["train.py"])
        assert "the script starts again from its beginning" in resume_note(rec)
        at = datetime.now(timezone.utc)
        rec.messages.handle([WorkerMessage(kind=MessageKind.SNAPSHOT_TAKEN, rank=1, at=at,
                                           data={"step": 10})], 0)
        assert resume_note(rec) == ""  # it may resume from that snapshot
