"""The review of walk-through 31's launch check of a checkpoint dir (#3 there): the cases it
let through.

#11: a stale owner mark in a job's default checkpoints/ (left by a job that took it over
once, and ended) hid that job dir's own job while it ran again: a third job was accepted.

#13: a lost job whose node agents still train (its launcher killed) counted as ended: another
job took its checkpoint dir while its ranks still wrote there."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from trainguard.controller.dir_owner import OWNER_NAME
from trainguard.controller.store import JobStore
from trainguard.controller.store_rows import NodeRow
from trainguard.errors import SpecError
from trainguard.launch_ckpt_dir import check_checkpoint_dir, claim_checkpoint_dir
from trainguard.paths import LOCK_NAME, JobPaths
from trainguard.states import NodeState


def paths(job_dir: Path, ck: str) -> JobPaths:
    return JobPaths(job_dir, job_dir / "logs", ck, checkpoint_dir_key="checkpoint_dir")


def _agent(node: str) -> subprocess.Popen[bytes]:
    """A process that reads as `node`'s agent (its module and --node in its argv, leading
    its own group)."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                             "trainguard.node.main", "--node", node], start_new_session=True)


def _lost_job(job: Path, agents: dict[str, int | None]) -> None:
    """A multi-node job whose launcher is gone (no lock held, no launcher pid alive)."""
    now = datetime.now(timezone.utc)
    with JobStore.create(job, "job-a") as s:
        s.set_meta(state="running", job_dir=str(job), launcher_pid=2 ** 22 + 1,
                   launcher_host="elsewhere")
        s.put_nodes([NodeRow(name, "localhost", NodeState.HEALTHY, pid, i, None, now, "local")
                     for i, (name, pid) in enumerate(agents.items())])


def test_a_lost_job_whose_agents_train_on_keeps_its_checkpoint_dir(tmp_path: Path) -> None:
    a, ck = tmp_path / "a", tmp_path / "ck"
    ck.mkdir()
    (ck / OWNER_NAME).write_text(json.dumps({"run_id": "job-a", "job_dir": str(a),
                                             "host": "elsewhere", "pid": 1}))
    agent = _agent("node-1")
    try:
        _lost_job(a, {"node-0": None, "node-1": agent.pid})
        with pytest.raises(SpecError) as e:
            check_checkpoint_dir(paths(tmp_path / "b", str(ck)))
    finally:
        agent.kill()
        agent.wait()
    assert str(e.value) == (
        f"--checkpoint-dir / 'checkpoint_dir': {ck} is the checkpoint dir of the lost job "
        f"'job-a' (job dir {a}): its launcher is gone, but the node agents of node-1 still run "
        "and their workers train on: both jobs would save the same steps, this job's saves "
        "would find them committed and write nothing, and a restart of it would resume the "
        f"other job's weights. Fix: `trainguard stop {a}` ends them (or run that job's "
        "command again to take it over), or give each job its own --checkpoint-dir")
    check_checkpoint_dir(paths(tmp_path / "b", str(ck)))  # its agents ended: taken over


def test_a_stale_mark_in_a_running_jobs_default_dir_does_not_hide_that_job(
        tmp_path: Path) -> None:
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    with JobStore.create(a, "job-a"):
        pass
    ck = a / "checkpoints"
    ck.mkdir()
    # B once continued from A's checkpoints (its mark), and ended; A runs again (continued)
    (ck / OWNER_NAME).write_text(json.dumps({"run_id": "job-b", "job_dir": str(b),
                                             "host": "elsewhere", "pid": 1}))
    with open(a / LOCK_NAME, "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with pytest.raises(SpecError, match=r"of the running job 'job-a' \(job dir "):
            check_checkpoint_dir(paths(c, str(ck)))
    # A's launch makes the dir its own again: B's mark goes
    claim_checkpoint_dir(JobPaths(a, a / "logs", str(ck)), "job-a")
    owner = json.loads((ck / OWNER_NAME).read_text())
    assert (owner["run_id"], owner["job_dir"]) == ("job-a", str(a))


RACER = """import fcntl, sys, time
from pathlib import Path
from trainguard.errors import SpecError
from trainguard.launch_checks import prepare
from trainguard.paths import LOCK_NAME
from trainguard.spec import JobSpec
name = sys.argv[2]
spec = JobSpec(entrypoint="t.py", nproc_per_node=1, job_dir=name, checkpoint_dir="ck")
Path(f"ready-{name}").touch()
while not Path("go").exists():
    time.sleep(0.0005)
try:
    spec, paths = prepare(spec, create=True)
    f = open(paths.job_dir / LOCK_NAME, "a+")  # as run does next
    fcntl.flock(f, fcntl.LOCK_EX)
    print("passed", flush=True)
    while not Path("done").exists():
        time.sleep(0.01)
except SpecError as e:
    print("refused", e, flush=True)
"""


def test_two_launches_at_once_on_one_checkpoint_dir_let_exactly_one_pass(
        tmp_path: Path) -> None:
    """Review #2: the check read the mark and the claim wrote it later, with no lock around
    the pair: two launchers released together both passed (the last writer's mark won). Five
    trials of two launchers (their argv says trainguard, as a launcher's does)."""
    for trial in range(5):
        here = tmp_path / str(trial)
        here.mkdir()
        racers = [subprocess.Popen([sys.executable, "-c", RACER, "trainguard", name],
                                   cwd=here, stdout=subprocess.PIPE, text=True)
                  for name in ("a", "b")]
        try:
            deadline = time.monotonic() + 60
            while not all((here / f"ready-{n}").exists() for n in "ab"):
                assert time.monotonic() < deadline
                time.sleep(0.01)
            (here / "go").touch()
            outs = [p.stdout.readline() for p in racers if p.stdout is not None]
        finally:
            (here / "done").touch()
            for p in racers:
                p.communicate(timeout=30)
        assert sorted(o.split()[0] for o in outs) == ["passed", "refused"], (trial, outs)
        assert "is the checkpoint dir of the running job" in "".join(outs)


def test_an_object_store_that_does_not_answer_costs_the_launch_one_wait_in_all(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review #7: the check and the claim each waited up to 10 s for a store that does not
    answer (a real endpoint that accepts connections and never replies); one wait now covers
    the check, the claim and the checks around it, and nothing is written once it is spent."""
    import socket
    import threading

    import trainguard.launch_ckpt_dir as lc
    from trainguard.launch_checks import prepare
    from trainguard.spec import JobSpec

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])  # read nothing, answer nothing
            except OSError:
                continue
    threading.Thread(target=accept, daemon=True).start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{server.getsockname()[1]}")
    for k, v in (("AWS_ACCESS_KEY_ID", "x"), ("AWS_SECRET_ACCESS_KEY", "x"),
                 ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(lc, "STORE_WAIT_S", 2.0)
    monkeypatch.chdir(tmp_path)
    spec = JobSpec(entrypoint="t.py", nproc_per_node=1, job_dir="j",
                   checkpoint_dir=f"s3://silent-{os.getpid()}/run")
    try:
        t0 = time.monotonic()
        prepare(spec, create=True)
        took = time.monotonic() - t0
    finally:
        stop.set()
        for c in held:
            c.close()
        server.close()
    assert took < 4.5, took  # 2 s, not 2 s per request
