"""The dashboard's goodput: trainguard.goodput's ledger of the job, in the job list and the
job view, computed once per job state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_ui_api import api_client, event, make_job
from trainguard.controller.store import JobStore
from trainguard.ui import goodput_view
from trainguard.ui.catalog import Catalog, job_id


def test_the_list_and_the_view_show_the_ledgers_goodput_and_its_parts(tmp_path: Path) -> None:
    make_job(tmp_path / "j").close()
    with api_client(Catalog([tmp_path / "j"])) as c:
        ratio = c.get("/api/jobs").json()[0]["goodput"]
        ledger = c.get(f"/api/jobs/{job_id((tmp_path / 'j').resolve())}").json()[
            "goodput_detail"]
    assert ratio is not None and 0 < ratio < 1 and ledger["goodput"] == ratio
    parts = ledger["productive_s"] + sum(ledger["badput_s"].values())
    assert parts == pytest.approx(ledger["wall_s"], rel=0.01)
    assert ledger["badput_s"]["hang"] > 0 and ledger["step_seconds"]


def test_an_ended_jobs_goodput_is_computed_again_only_when_its_store_changes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_job(tmp_path / "j").close()
    calls: list[Path] = []
    real = goodput_view.job_goodput

    def counting(store: JobStore) -> Any:
        calls.append(store.job_dir)
        return real(store)

    monkeypatch.setattr(goodput_view, "job_goodput", counting)
    jid = job_id((tmp_path / "j").resolve())
    with api_client(Catalog([tmp_path / "j"])) as c:
        for path in ("/api/jobs", f"/api/jobs/{jid}", f"/api/jobs/{jid}/goodput", "/api/jobs"):
            assert c.get(path).status_code == 200
        assert len(calls) == 1
        with JobStore.create(tmp_path / "j", "tg-ui") as store:
            store.add_event(event("JobSucceeded", 61, attempt=1))
        c.get("/api/jobs")
        assert len(calls) == 2
