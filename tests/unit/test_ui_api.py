"""`trainguard ui`'s API over real job stores in tmp_path: the JSON views, the event stream's
framing and its resumption from Last-Event-ID, the token and Host checks, log tails of big
files read from the end, and the job catalog. A live stream runs against a real uvicorn
server in a thread (the TestClient waits for a response's end)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.testclient import TestClient

from tests.unit.ui_process import running_ui
from trainguard.cli import main as cli_main
from trainguard.controller.store import JobStore, WorkerRow
from trainguard.records import (
    Event,
    FaultScenario,
    Involved,
    Level,
    RecoverRecord,
    RecoverResult,
    RunningRecord,
    StartType,
)
from trainguard.states import WorkerState
from trainguard.ui import logtail
from trainguard.ui.app import create_app
from trainguard.ui.catalog import Catalog, find_job_dirs, job_id
from trainguard.ui.jobs import checkpoint_item
from trainguard.ui.server import bind

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=timezone.utc)
RUN = "tg-ui"
DECIDING = "RuntimeError: CUDA error: an illegal memory access was encountered"
SYMPTOM = "RuntimeError: Connection closed by peer"
LOCAL = "http://127.0.0.1"
TOKEN = "test-token"


def api_client(catalog: Catalog) -> TestClient:
    """A TestClient of the dashboard over `catalog`. Its requests come from no socket, so a
    dashboard without a token refuses them (the owner of the client's end cannot be told:
    fail closed); this one has a token and sends it."""
    return TestClient(create_app(catalog, token=TOKEN), base_url=LOCAL,
                      headers={"Authorization": f"Bearer {TOKEN}"})


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def event(reason: str, s: float, attempt: int | None = 0, rank: int | None = None,
          data: dict[str, Any] | None = None, message: str | None = None) -> Event:
    return Event(at(s), Level.INFO, reason, message or f"{reason} message",
                 Involved(RUN, "node-0", rank, attempt), data)


def stamped(s: float, stream: str, text: str) -> str:
    return f"{at(s).isoformat()} {stream} {text}\n"


def make_job(job_dir: Path, *, running: bool = False) -> JobStore:
    """A job of two attempts: attempt 0 failed (diagnosed, a hang confirmed before), attempt
    1 ran after an auto restart. Logs and a stack dump beside it."""
    store = JobStore.create(job_dir, RUN)
    logs = job_dir / "logs"
    store.set_meta(state="running" if running else "succeeded", log_dir=str(logs),
                   created_at=at(0).isoformat(), last_step=30,
                   launcher_pid=os.getpid(), launcher_host=socket.gethostname(),
                   ended_at=None if running else at(60).isoformat())
    rr = RecoverRecord(attempt=0, recover_start_at=at(20), fault_scenario=FaultScenario.CHIP_FAULT,
                       reason="rank 1: illegal memory access", related_task="worker-1",
                       recover_result=RecoverResult.SUCCESS, fault_at=at(20), detected_at=at(20.5),
                       workers_stopped_at=at(21), decided_at=at(21), workers_started_at=at(22),
                       first_progress_at=at(26), resumed_step=10, last_step_before=14)
    store.put_running(RunningRecord(0, at(1), StartType.FIRST_START, end_at=at(21),
                                    end_reason="gpu_hardware", first_step=1, last_step=14,
                                    recover_records=[rr]))
    store.put_running(RunningRecord(1, at(21), StartType.AUTO_RESTART,
                                    end_at=None if running else at(60), first_step=11,
                                    last_step=30))
    store.put_workers(1, [WorkerRow(1, r, r, "node-0", 100 + r, WorkerState.RUNNING)
                          for r in (0, 1)])
    diagnosis = {"category": "gpu_hardware", "summary": "rank 1: illegal memory access",
                 "culprit": {"rank": 1, "frame": "train.py:9 in step"},
                 "evidence": {"file": "logs/attempt-0/rank-1.log", "line": 3, "text": DECIDING,
                              "rank": 1},
                 "symptoms": [{"file": "logs/attempt-0/rank-0.log", "line": 2, "text": SYMPTOM,
                               "rank": 0}]}
    hang = {"culprit": {"rank": 1, "reason": "Rank 1 is sleeping", "by_rank": {"0": "collective",
                                                                               "1": "sleep"}},
            "stuck_ranks": [0, 1], "idle_s": 8.0, "threshold_s": 8.0,
            "stacks": {"0": ["all_reduce (c10d:0)"], "1": ["sleep (time:0)"]}}
    store.add_progress([(0, i, at(1 + i).timestamp()) for i in range(1, 15)]
                       + [(1, i, at(15 + i).timestamp()) for i in range(11, 31)])
    for e in (event("JobCreated", 0, None), event("JobRunning", 1),
              event("CheckpointSaved", 5, rank=0, data={"step": 10, "blocked_s": 0.25,
                                                        "write_s": 1.5, "bytes": 3 * 2**20}),
              event("CheckpointSaved", 6, rank=0, message="checkpoint of step 12 committed at "
                    "/ck (loop blocked 0.011s, written in 0.045s, 1.3 MiB)"),
              event("HangConfirmed", 15, rank=1, data=hang),
              event("FailureDiagnosed", 20.6, rank=1, data=diagnosis),
              event("WorkersRestarted", 21, attempt=1)):
        store.add_event(e)
    for a, r, lines in ((0, 0, ["step 1", SYMPTOM, "bye"]),
                        (0, 1, ["step 1", "Traceback (most recent call last):", DECIDING]),
                        (1, 0, [f"step {i}" for i in range(11, 31)])):
        path = logs / f"attempt-{a}" / f"rank-{r}.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(stamped(i, "err" if "Error" in t else "out", t)
                                for i, t in enumerate(lines)))
    stacks = logs / "attempt-0" / "stacks"
    stacks.mkdir()
    (stacks / "rank-1.txt").write_text("Thread 1 (idle): MainThread\n    sleep (time)\n")
    (stacks / "hang.json").write_text(json.dumps({"culprit": hang["culprit"]}))
    return store


@pytest.fixture
def job(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "runs" / "job-a"
    make_job(d).close()
    yield d


@pytest.fixture
def client(job: Path) -> Iterator[TestClient]:
    with api_client(Catalog([job])) as c:
        yield c


def sse(text: str) -> list[dict[str, str]]:
    """The messages of an event stream, each as its fields (comments dropped)."""
    out = []
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            if line and not line.startswith(":"):
                name, _, value = line.partition(": ")
                fields[name] = value
        if fields:
            out.append(fields)
    return out


# -- the JSON views ------------------------------------------------------------------------

def test_the_job_list_shows_state_attempts_and_last_progress(client: TestClient,
                                                             job: Path) -> None:
    rows = client.get("/api/jobs").json()
    assert [r["id"] for r in rows] == [job_id(job.resolve())]
    row = rows[0]
    assert row["run_id"] == RUN and row["state"] == "succeeded" and row["ended"] is True
    assert row["attempts"] == 2 and row["incidents"] == 1 and row["last_step"] == 30
    assert "goodput" in row and row["error"] is None


def test_a_job_without_step_reports_shows_its_last_checkpoint_as_progress(
        tmp_path: Path) -> None:
    """Walk-through 38 #2: `status`, `ls` and `metrics` show a job that reports no steps at
    its last committed checkpoint; the dashboard said '-'."""
    d = tmp_path / "quiet"
    with JobStore.create(d, RUN) as store:
        store.set_meta(state="succeeded", created_at=at(0).isoformat(),
                       ended_at=at(30).isoformat())
        store.add_event(event("CheckpointSaved", 25, rank=0, data={"step": 25}))
    with api_client(Catalog([d])) as c:
        (row,) = c.get("/api/jobs").json()
        view = c.get(f"/api/jobs/{job_id(d.resolve())}").json()
    for doc in (row, view):
        assert (doc["last_step"], doc["progress_source"]) == (25, "checkpoint"), doc
        assert doc["last_progress_at"] is not None


def test_a_stop_under_way_reads_stopping_in_the_list_and_the_view(tmp_path: Path) -> None:
    """Walk-through 38 #1: `status` says `running · STOPPING` through a stop's grace period;
    the dashboard said running until the job had stopped."""
    d = tmp_path / "stopping"
    with make_job(d, running=True) as store:
        store.add_event(event("StopRequested", 50, data={"signal": "SIGTERM", "grace_s": 20.0}))
    with api_client(Catalog([d])) as c:
        (row,) = c.get("/api/jobs").json()
        view = c.get(f"/api/jobs/{job_id(d.resolve())}").json()
    for doc in (row, view):
        stopping = doc["stopping"]
        assert doc["state"] == "running" and stopping is not None, doc
        assert (stopping["signal"], stopping["grace_s"]) == ("SIGTERM", 20.0), stopping
        assert datetime.fromisoformat(stopping["requested_at"]) == at(50), stopping
    with JobStore.create(d, RUN) as store:  # review 45 #4: then lost in its stop (--force)
        store.set_meta(launcher_pid=2**22 + 12345)  # no such process
    with api_client(Catalog([d])) as c:
        (row,) = c.get("/api/jobs").json()
        view = c.get(f"/api/jobs/{job_id(d.resolve())}").json()
    assert (row["state"], row["stopping"], view["stopping"]) == ("lost", None, None)


def test_a_job_whose_launcher_died_reads_lost(tmp_path: Path) -> None:
    d = tmp_path / "lost"
    with make_job(d, running=True) as store:
        store.set_meta(launcher_pid=2**22 + 12345)  # no such process
    with api_client(Catalog([d])) as c:
        assert c.get("/api/jobs").json()[0]["state"] == "lost"
        # walk-through 38 #6: its ranks, running when the launcher died, read lost as in
        # `status` (the dashboard said running)
        view = c.get(f"/api/jobs/{job_id(d.resolve())}").json()
        assert [w["state"] for w in view["workers"]] == ["lost", "lost"], view["workers"]


def test_a_hang_left_running_reads_hung_in_the_list_the_view_and_the_metrics(
        tmp_path: Path) -> None:
    """Walk-through 24: `status` said HUNG (confirmed, left running); the dashboard and the
    metrics said only `running`."""
    from prometheus_client.parser import text_string_to_metric_families

    from trainguard.goodput.metrics import exposition

    d = tmp_path / "hung"
    with make_job(d, running=True) as store:  # attempt 0's hang is not this attempt's
        store.set_meta(attempt=1)
    with api_client(Catalog([d])) as c:
        assert c.get("/api/jobs").json()[0]["hang"] is None
        with JobStore.create(d, RUN) as store:
            store.add_event(event("HangConfirmed", 40, attempt=1, rank=1, data={
                "culprit": {"rank": 1, "reason": "Rank 1 is sleeping"}, "stuck_ranks": [0, 1],
                "confirmed_at": at(40).isoformat()}))
        row = c.get("/api/jobs").json()[0]
        assert row["state"] == "running" and row["hang"] == {
            "confirmed_at": at(40).isoformat(), "ranks": [0, 1], "culprit": "Rank 1 is sleeping"}
        view = c.get(f"/api/jobs/{row['id']}").json()
        assert view["hang"]["culprit"] == "Rank 1 is sleeping"
    (hung,) = [m for m in text_string_to_metric_families(exposition(d).decode())
               if m.name == "trainguard_job_hung"]
    assert [x.value for x in hung.samples] == [1.0]


def test_the_job_view_has_attempts_recoveries_diagnoses_hangs_and_checkpoints(
        client: TestClient, job: Path) -> None:
    doc = client.get(f"/api/jobs/{job_id(job.resolve())}").json()
    assert [r["start_type"] for r in doc["records"]] == ["first_start", "auto_restart"]
    rr = doc["records"][0]["recover_records"][0]
    assert rr["fault_scenario"] == "chip_fault" and rr["recover_result"] == "success"
    assert rr["durations_s"] == {"detect": 0.5, "stop": 0.5, "decide": 0.0, "start": 1.0,
                                 "resume": 4.0, "total": 6.0}
    assert doc["diagnoses"][0]["diagnosis"]["evidence"]["text"] == DECIDING
    assert doc["hangs"][0]["culprit"]["rank"] == 1
    ck = doc["checkpoints"]
    assert ck["count"] == 2
    assert [(c["step"], c["blocked_s"], c["mib"], c["size"]) for c in ck["items"]] == [
        (12, 0.011, 1.3, None), (10, 0.25, 3.0, "3.0 MiB")]  # newest first; from the message,
    # then the data; a small one in the CLI's words (walk-through 40 #9: 44.9 KiB read 0.0 MiB)
    small = checkpoint_item(1, Event(datetime(2026, 12, 7, tzinfo=timezone.utc), Level.INFO,
                                     "CheckpointSaved", "saved", Involved(job="r"),
                                     {"step": 3, "bytes": 45978}))
    assert (small["mib"], small["size"]) == (0.0438, "44.9 KiB")
    assert [w["rank"] for w in doc["workers"]] == [0, 1]
    assert doc["last_event_id"] == 7 and doc["events_total"] == 7


def test_an_unknown_job_is_404_and_bad_numbers_are_400(client: TestClient, job: Path) -> None:
    assert client.get("/api/jobs/nope").status_code == 404
    assert client.get("/jobs/nope").status_code == 404
    jid = job_id(job.resolve())
    assert client.get(f"/api/jobs/{jid}/events?after=x").status_code == 400
    assert client.get(f"/api/jobs/{jid}/logs/0/1?line=0").status_code == 400
    assert client.get(f"/api/jobs/{jid}/logs/0/7").status_code == 404


def test_pages_and_assets_are_served_with_a_strict_policy(client: TestClient, job: Path) -> None:
    page = client.get(f"/jobs/{job_id(job.resolve())}")
    assert page.status_code == 200 and "<section" in page.text
    assert "default-src 'self'" in page.headers["content-security-policy"]
    for asset in ("common.js", "job.js", "timeline.js", "ui.css"):
        assert client.get(f"/static/{asset}").status_code == 200


def test_events_page_after_an_id_or_give_the_newest(client: TestClient, job: Path) -> None:
    base = f"/api/jobs/{job_id(job.resolve())}/events"
    got = client.get(f"{base}?after=3&limit=2").json()
    assert [e["id"] for e in got["events"]] == [4, 5] and got["last_id"] == 7
    assert [e["id"] for e in client.get(f"{base}?limit=2").json()["events"]] == [6, 7]


def test_hangs_come_with_every_ranks_stack_and_the_culprit(client: TestClient,
                                                           job: Path) -> None:
    (hang,) = client.get(f"/api/jobs/{job_id(job.resolve())}/hangs").json()
    ranks = {r["rank"]: r for r in hang["ranks"]}
    assert set(ranks) == {0, 1}
    assert ranks[1]["culprit"] and "sleep (time)" in ranks[1]["text"]  # the dumped file
    assert not ranks[0]["culprit"] and ranks[0]["frames"] == ["all_reduce (c10d:0)"]
    assert ranks[0]["doing"] == "collective"


# -- logs --------------------------------------------------------------------------------

def test_a_log_tail_marks_the_deciding_line_and_the_symptoms(client: TestClient,
                                                             job: Path) -> None:
    base = f"/api/jobs/{job_id(job.resolve())}/logs"
    assert [(x["attempt"], x["rank"]) for x in client.get(base).json()] == [
        (0, 0), (0, 1), (1, 0)]
    culprit = client.get(f"{base}/0/1?tail=10").json()
    assert [(ln["n"], ln["mark"]) for ln in culprit["lines"]] == [
        (1, None), (2, None), (3, "decisive")]
    assert culprit["lines"][2]["text"] == DECIDING and culprit["lines"][2]["stream"] == "err"
    peer = client.get(f"{base}/0/0?tail=10").json()
    assert [ln["mark"] for ln in peer["lines"]] == [None, "symptom", None]
    later = client.get(f"{base}/1/0?tail=5").json()
    assert [ln["text"] for ln in later["lines"]] == [f"step {i}" for i in range(26, 31)]
    assert all(ln["mark"] is None for ln in later["lines"])
    around = client.get(f"{base}/1/0?line=10&context=1").json()
    assert [ln["n"] for ln in around["lines"]] == [9, 10, 11]


class _Counting:
    """An open() that counts the bytes read through it."""

    def __init__(self) -> None:
        self.read = 0

    def __call__(self, path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        f = open(path, mode, *args, **kwargs)  # noqa: SIM115
        outer = self

        class Wrapped:
            def __enter__(self) -> Wrapped:
                return self

            def __exit__(self, *exc: object) -> None:
                f.close()

            def read(self, n: int = -1) -> bytes:
                data: bytes = f.read(n)
                outer.read += len(data)
                return data

            def __getattr__(self, name: str) -> Any:
                return getattr(f, name)
        return Wrapped()


def test_the_tail_of_a_huge_log_reads_only_its_end(client: TestClient, job: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    path = job / "logs" / "attempt-1" / "rank-1.log"
    with open(path, "wb") as f:  # 4 GiB, sparse: what a tail must never read whole
        f.truncate(4 * 2**30)
        f.seek(0, os.SEEK_END)
        f.write(b"".join(stamped(i, "out", f"line {i}").encode() for i in range(300)))
    counting = _Counting()
    monkeypatch.setattr(logtail, "open", counting, raising=False)
    started = time.monotonic()
    doc = client.get(f"/api/jobs/{job_id(job.resolve())}/logs/1/1?tail=100").json()
    assert time.monotonic() - started < 5.0  # reading 4 GiB would take minutes
    assert [ln["text"] for ln in doc["lines"]] == [f"line {i}" for i in range(200, 300)]
    assert all(ln["n"] is None for ln in doc["lines"])  # too big to count its lines
    assert doc["size"] > 4 * 2**30 and doc["complete"]
    assert 0 < counting.read <= 2 * logtail.BLOCK


# -- the event stream ----------------------------------------------------------------------

def test_an_ended_jobs_stream_sends_the_job_then_its_events_with_ids_then_the_end(
        client: TestClient, job: Path) -> None:
    r = client.get(f"/api/jobs/{job_id(job.resolve())}/stream")
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.text.startswith("retry: ")
    msgs = sse(r.text)[1:]
    events = [m for m in msgs if m["event"] == "event"]
    assert [int(m["id"]) for m in events] == list(range(1, 8))
    assert all(json.loads(m["data"])["id"] == int(m["id"]) for m in events)
    kinds = [m["event"] for m in msgs]
    assert kinds[0] == "job" and kinds[-1] == "end" and kinds.count("job") == 1
    live = json.loads(msgs[0]["data"])
    assert live["state"] == "succeeded" and len(live["records"]) == 2
    assert "id" not in msgs[0]  # a job update leaves the last event id alone


@pytest.mark.parametrize("how", ["header", "query"])
def test_a_reconnecting_stream_resumes_after_the_last_event_id(
        client: TestClient, job: Path, how: str) -> None:
    url = f"/api/jobs/{job_id(job.resolve())}/stream"
    r = (client.get(url, headers={"Last-Event-ID": "5"}) if how == "header"
         else client.get(f"{url}?after=5"))
    ids = [int(m["id"]) for m in sse(r.text) if m.get("event") == "event"]
    assert ids == [6, 7]


@pytest.fixture
def live_server(tmp_path: Path) -> Iterator[tuple[str, JobStore]]:
    store = make_job(tmp_path / "live", running=True)
    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(create_app(Catalog([tmp_path / "live"])),
                                           log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    while not server.started:
        time.sleep(0.02)
    try:
        yield url, store
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
        store.close()


def test_a_running_jobs_stream_pushes_new_events_and_attempts_as_they_are_written(
        live_server: tuple[str, JobStore], tmp_path: Path) -> None:
    url, store = live_server
    jid = job_id((tmp_path / "live").resolve())
    seen: list[dict[str, str]] = []
    with httpx.stream("GET", f"{url}/api/jobs/{jid}/stream", timeout=10) as r:
        buf = ""
        wrote = False
        for chunk in r.iter_text():
            buf += chunk
            seen = sse(buf)
            if not wrote and any(m.get("id") == "7" for m in seen):
                store.add_event(event("WorkerFailed", 40, attempt=1, rank=0))
                store.put_running(RunningRecord(2, at(41), StartType.AUTO_RESTART))
                wrote = True
            jobs = [json.loads(m["data"]) for m in seen if m.get("event") == "job"]
            if any(m.get("id") == "8" for m in seen) and jobs and len(jobs[-1]["records"]) == 3:
                break
    assert [m["event"] for m in seen if m.get("id") == "8"] == ["event"]
    assert "end" not in [m.get("event") for m in seen]  # it runs: the stream stays open


# -- who may read --------------------------------------------------------------------------

def test_with_a_token_every_request_needs_it_and_a_page_opened_with_it_sets_a_cookie(
        job: Path) -> None:
    app = create_app(Catalog([job]), token="s3cret")
    jid = job_id(job.resolve())
    with TestClient(app, base_url="http://10.1.2.3:8642") as c:
        for path in ("/", "/api/jobs", f"/api/jobs/{jid}/stream", "/static/job.js"):
            assert c.get(path).status_code == 401, path
        assert c.get("/api/jobs?token=wrong").status_code == 401
        assert c.get("/api/jobs", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        opened = c.get(f"/jobs/{jid}?token=s3cret")
        assert opened.status_code == 200 and "HttpOnly" in opened.headers["set-cookie"]
        assert c.get(f"/api/jobs/{jid}/stream?after=7").status_code == 200  # by the cookie


def test_without_a_token_only_loopback_hosts_are_answered(job: Path) -> None:
    with running_ui(job) as (_, port):
        url = f"http://127.0.0.1:{port}/api/jobs"
        assert httpx.get(url, timeout=10).status_code == 200
        for host, code in (("localhost", 200), ("[::1]", 200), ("evil.example", 403)):
            r = httpx.get(url, headers={"Host": f"{host}:{port}"}, timeout=10)
            assert r.status_code == code, (host, r.text)


def test_a_request_from_no_socket_is_refused_without_a_token(job: Path) -> None:
    """A client whose socket's owner cannot be looked up (not a loopback address and port:
    here the TestClient's) is refused, not let through (review of walk-through 32 #1)."""
    with TestClient(create_app(Catalog([job])), base_url=LOCAL) as c:
        r = c.get("/api/jobs")
        assert r.status_code == 403 and "cannot be told" in r.json()["error"], r.text


def test_the_command_needs_a_job_dir_or_a_root(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["ui"]) == 2
    assert "JOB_DIR" in capsys.readouterr().err


# -- the catalog ---------------------------------------------------------------------------

def test_the_root_is_searched_two_levels_down_on_every_listing(tmp_path: Path) -> None:
    make_job(tmp_path / "a").close()
    make_job(tmp_path / "group" / "b").close()
    make_job(tmp_path / "x" / "y" / "too-deep").close()
    catalog = Catalog([], root=tmp_path)
    assert sorted(p.name for p in catalog.jobs().values()) == ["a", "b"]
    assert find_job_dirs(tmp_path, depth=3)[-1].name == "too-deep"
    make_job(tmp_path / "c").close()
    assert "c" in {p.name for p in catalog.jobs().values()}
    assert catalog.find(job_id((tmp_path / "c").resolve())) == (tmp_path / "c").resolve()


def test_restarts_are_the_recoveries_status_counts_not_the_relaunches(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "relaunched"
    with make_job(d) as store:  # one recovery, then two relaunches of the job dir
        for a in (2, 3):
            store.put_running(RunningRecord(a, at(60 + a), StartType.RELAUNCH, end_at=at(61 + a)))
    with api_client(Catalog([d])) as c:
        row = c.get("/api/jobs").json()[0]
        assert (row["attempts"], row["restarts"]) == (4, 1)
        assert c.get(f"/api/jobs/{row['id']}").json()["restarts"] == 1
    cli_main(["status", "--json", str(d)])
    assert json.loads(capsys.readouterr().out)["restarts"] == 1


def test_a_dir_of_job_dirs_given_as_a_job_is_told_to_use_root(tmp_path: Path) -> None:
    """Walk-through 39 #13: `trainguard ui DIR` on a dir of job dirs said only "check the
    path"; `status` in the same case names `trainguard ls`."""
    from trainguard.controller.store import JobStore
    from trainguard.ui.server import missing_notes

    JobStore.create(tmp_path / "runs" / "a", "a").close()
    (tmp_path / "typo").mkdir()
    runs, typo = missing_notes([tmp_path / "runs", tmp_path / "typo"])
    assert runs.endswith(f"it holds job dirs: `trainguard ui --root {tmp_path / 'runs'}` "
                         "shows them all"), runs
    assert typo.endswith("check the path if you meant a job that ran"), typo
    assert missing_notes([tmp_path / "runs" / "a"]) == []
