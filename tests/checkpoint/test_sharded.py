"""FSDP2 (fully_shard, DTensor) states go through DCP and resume exactly, under the launcher."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch

from tests.integration.conftest import read_json, run_tg

SCRIPT = Path(__file__).parent / "scripts" / "fsdp_train.py"


def run(tmp_path: Path, name: str, fault: str | None = None) -> dict[str, torch.Tensor]:
    out = tmp_path / f"{name}.pt"
    r = run_tg(["run", "--nproc-per-node", "2", "--max-restarts", "2", "--restart-backoff",
                "0.1", "--job-dir", name, str(SCRIPT), "--out", str(out)], cwd=tmp_path,
               fault=fault)
    assert r.returncode == 0, r.stderr[-3000:]
    return torch.load(out, weights_only=True)  # type: ignore[no-any-return]


@pytest.mark.integration
def test_an_fsdp2_job_killed_mid_run_resumes_to_exactly_the_uninterrupted_parameters(
        tmp_path: Path) -> None:
    straight = run(tmp_path, "straight")
    resumed = run(tmp_path, "crashed", fault="signal:KILL@rank=1,step=13")
    assert straight.keys() == resumed.keys()
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    events = read_json("events", tmp_path / "crashed")
    # the newest checkpoint committed before the kill at step 13: step 10, or step 5 when a
    # loaded machine had not committed step 10's async save yet (a CI rehearsal saw that)
    reasons = [e["reason"] for e in events]
    killed = reasons.index("WorkerFailed")
    committed = [e["data"]["step"] for e in events[:killed] if e["reason"] == "CheckpointSaved"]
    assert committed and committed[-1] in (5, 10), committed
    # resumed from the newest step committed before the kill: the one whose event came
    # first, or a later one whose save committed as the kill struck (a CI rehearsal at a
    # load of 5: step 10's CheckpointSaved came after the WorkerFailed)
    resumed = [e for e in events if e["reason"] == "Resumed"]
    assert resumed and resumed[0]["data"]["step"] in (5, 10), resumed
    assert resumed[0]["data"]["step"] >= committed[-1], (resumed, committed)
    # a later restart only for gloo's native abort at a rank's exit ("terminate called without
    # an active exception": pytorch#179291, README's known limits; a rehearsal saw one at
    # step 20), the job then resumed on and ended with the same parameters (asserted above)
    later = [e["data"]["summary"] for e in events if e["reason"] == "FailureDiagnosed"][1:]
    assert len(resumed) == 1 + len(later), resumed
    assert all("terminate called without an active exception" in s for s in later), later
    step_dir = tmp_path / "crashed" / "checkpoints" / "step-000000020"
    manifest = (step_dir / "manifest.json").read_text()
    assert "sharded/__0_0.distcp" in manifest and "sharded/__1_0.distcp" in manifest
    assert "sharded/.metadata" in manifest


@pytest.mark.integration
def test_sharded_state_with_if_busy_skip_skips_on_every_rank_alike(tmp_path: Path) -> None:
    """Review 38 #5: each rank decided "skip" by its own save in flight; rank 0's (until the
    commit) outlasts the others' (their part written), so rank 1 entered DCP's collective save
    while rank 0 skipped it and ran on into the next step's all-gather: gloo aborted."""
    script = Path(__file__).parent / "scripts" / "fsdp_skip.py"
    r = run_tg(["run", "--nproc-per-node", "2", "--job-dir", "j", str(script), "--out",
                str(tmp_path / "out.pt")], cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    started = sorted(line.split("started saves ")[1] for line in r.stdout.splitlines()
                     if "started saves" in line)
    assert len(started) == 2 and started[0] == started[1], r.stdout[-2000:]
    events = read_json("events", tmp_path / "j")
    assert any(e["reason"] == "CheckpointSaveSkipped" for e in events)  # the case it tests
    latest = (tmp_path / "j" / "checkpoints" / "latest").read_text().strip()
    assert latest == "step-000000012", latest  # the last step: skipped, written by close()


@pytest.mark.integration
def test_a_rank_stopped_at_a_save_step_saves_it_with_the_others_voting_on_skips(
        tmp_path: Path) -> None:
    """Review 39 #6: rank 1, stopped (SIGTERM) at save step 4, entered DCP's save on its way
    out while rank 0 waited in the skip vote: neither moved, and the job hung (the hang
    detector allows a library phase 30 min). Now it votes that it stops; rank 0 saves step
    4 with it, and the restart resumes there."""
    script = Path(__file__).parent / "scripts" / "fsdp_skip.py"
    r = run_tg(["run", "--nproc-per-node", "2", "--max-restarts", "1", "--restart-backoff",
                "0.1", "--job-dir", "j", str(script), "--out", str(tmp_path / "out.pt"),
                "--save-on-exit"], cwd=tmp_path, fault="signal:TERM@rank=1,step=4",
               timeout=150)
    assert r.returncode == 0, r.stderr[-3000:]
    events = read_json("events", tmp_path / "j")
    resumed = [e["data"]["step"] for e in events if e["reason"] == "Resumed"]
    assert resumed == [4], [(e["reason"], e["message"][:120]) for e in events]


class _Boom:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("touch PWNED",))


def test_a_dcp_metadata_file_that_would_run_code_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Audit D7: DCP unpickles `.metadata`; ours admits only DCP's metadata classes."""
    from torch.distributed.checkpoint.metadata import Metadata

    from trainguard.checkpoint.dcp_safe import load_metadata

    monkeypatch.chdir(tmp_path)
    with pytest.raises(pickle.UnpicklingError, match="not allowed"):
        load_metadata(pickle.dumps(_Boom()))
    assert not (tmp_path / "PWNED").exists()
    md = Metadata(state_dict_metadata={})
    assert isinstance(load_metadata(pickle.dumps(md)), Metadata)
