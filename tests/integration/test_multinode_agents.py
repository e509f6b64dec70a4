"""Multi-node jobs on the local backend whose node agents die, freeze or outlive their
launcher (walk-through 23), and a second Ctrl-C that must reach every agent:

- a spare's agent killed -> seen (NodeLost), no longer counted a spare;
- a placed node frozen (SIGSTOP on its agent and workers) while hang detection looks at
  the stacks -> lost after the node timeout, not after the stack dump's own timeout, and
  the recovery record's detection time is the silence it waited out;
- the launcher SIGKILLed -> `stop` ends the agents that train on without it;
- a second Ctrl-C -> every agent SIGKILLs ranks that ignore SIGTERM.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

from tests.integration.conftest import read_json, run_tg
from tests.integration.multinode import (
    Background,
    events_of,
    job_args,
    kill_node,
    log_of,
    node,
    wait_for,
)


def test_a_dead_spare_is_seen_and_no_longer_counted_a_spare(tmp_path: Path) -> None:
    """(walk-through 23) A spare's agent killed: no event, and status kept showing it spare
    with a standby ready, through a later failure that found no spare."""
    job = tmp_path / "job"
    bg = Background(job_args(job, "--spare-nodes", "1", steps=3000), tmp_path)
    status = wait_for(job, lambda s: (s["last_progress"]["step"] or 0) >= 5)
    kill_node(status, "node-2")
    status = wait_for(job, lambda s: node(s, "node-2")["state"] == "lost", timeout=30)
    lost = events_of(job, "NodeLost")
    assert [e["involved"]["node"] for e in lost] == ["node-2"], lost
    assert "spare node node-2 was lost: its agent process ended" in lost[0]["message"]
    assert {n["name"]: n["state"] for n in status["nodes"]} == {
        "node-0": "healthy", "node-1": "healthy", "node-2": "lost"}
    assert run_tg(["stop", str(job)], cwd=tmp_path).returncode == 0
    bg.finish(timeout=60)


def test_stop_ends_the_agents_that_outlived_a_killed_launcher(tmp_path: Path) -> None:
    """(walk-through 23) The launcher of a multi-node job SIGKILLed: the job reads `lost`, but
    its agents wait for a controller to take over and their workers train on; `stop` said
    'already ended' and did nothing (so did `stop --force`, which kills only the launcher).
    Now stop ends the agents on this machine, and their workers with them."""
    import psutil

    job = tmp_path / "job"
    bg = Background(job_args(job, steps=3000), tmp_path)
    status = wait_for(job, lambda s: (s["last_progress"]["step"] or 0) >= 10)
    workers = [psutil.Process(r["pid"]) for r in status["ranks"]]
    agents = [psutil.Process(n["agent_pid"]) for n in status["nodes"]]
    bg.proc.kill()
    bg.finish(timeout=30)
    assert all(p.is_running() for p in workers + agents)  # training on, no controller
    # (walk-through 26) status said every rank `lost` and offered a resume from the newest
    # checkpoint: the ranks train on, and the same command takes the job over
    said = run_tg(["status", "--json", str(job)], cwd=tmp_path)
    doc = json.loads(said.stdout)
    assert doc["state"] == "lost" and doc["agents_without_controller"] == ["node-0", "node-1"]
    assert {r["state"] for r in doc["ranks"]} == {"running"}, doc["ranks"]
    said = run_tg(["status", str(job)], cwd=tmp_path)
    assert "no controller: the launcher is gone, but the node agents of node-0, node-1 still " \
        "run" in " ".join(said.stdout.split()), said.stdout
    assert "continue it:" not in said.stdout
    r = run_tg(["stop", str(job)], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "its node agents still ran its workers: ended node-0 (pid" in r.stdout
    _, alive = psutil.wait_procs(workers + agents, timeout=20)
    assert not alive, alive


def test_a_second_ctrl_c_ends_every_node_agents_grace_period(tmp_path: Path) -> None:
    """Ranks that ignore SIGTERM kept a stopping multi-node job for its whole grace period
    after a second Ctrl-C (the node agents never heard of it); the controller now passes the
    second signal on and every agent SIGKILLs what is left. Through the grace period the
    progress of the ranks that train on is recorded."""
    (tmp_path / "t.py").write_text(
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "for s in range(1, 10**6):\n    print(f'step {s}', flush=True)\n    time.sleep(0.2)\n")
    job = tmp_path / "job"
    bg = Background(["run", "--nnodes", "2", "--nproc-per-node", "1", "--job-dir", str(job),
                     "--grace-period", "60", "--no-standby-workers", str(tmp_path / "t.py")],
                    tmp_path)
    deadline = time.monotonic() + 120
    while not all((job / "logs" / "attempt-0" / f"rank-{r}.log").exists()
                  and "step 3" in log_of(job, 0, r) for r in (0, 1)):
        assert time.monotonic() < deadline and bg.proc.poll() is None, bg.console.read_text()
        time.sleep(0.3)
    bg.proc.send_signal(signal.SIGINT)
    deadline = time.monotonic() + 30  # the first stop is handled (not merged with the second)
    while "stop requested" not in bg.console.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.2)  # (a repeat within 1 s is the same stop delivered twice)
    assert bg.proc.poll() is None  # the ranks ignore SIGTERM: the grace period runs
    # they train on, and the agents' reports during the stop show it (walk-through 30)
    at_stop = read_json("status", job)["last_progress"]["step"]
    wait_for(job, lambda s: s["last_progress"]["step"] >= at_stop + 10, timeout=15)
    t0 = time.monotonic()
    bg.proc.send_signal(signal.SIGINT)
    code, out = bg.finish(timeout=60)
    assert time.monotonic() - t0 < 20, "the second Ctrl-C did not end the 60 s grace period"
    assert code == 128 + signal.SIGINT, out
    (stopped,) = events_of(job, "JobStopped")
    assert "ranks 0, 1 did not and got SIGKILL (a second signal cut the grace period short)" \
        in stopped["message"], stopped


def test_a_frozen_node_is_lost_after_the_node_timeout_not_the_stack_dumps(
        tmp_path: Path) -> None:
    """(walk-through 23) A node frozen whole (SIGSTOP): the other node's ranks stall in the
    collective, the hang watch asks every agent for its stacks, and the frozen agent held
    that call for the dump's own timeout (5 + 30 s): the node was declared lost after ~40 s
    instead of the 10 s node timeout, and the record read 0 s to detect it."""
    job = tmp_path / "job"
    bg = Background(job_args(job, "--spare-nodes", "1", "--node-timeout", "6", steps=3000),
                    tmp_path)
    status = wait_for(job, lambda s: (s["last_progress"]["step"] or 0) >= 15)
    frozen = node(status, "node-1")["agent_pid"]
    os.killpg(frozen, signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        wait_for(job, lambda s: node(s, "node-1")["state"] == "lost", timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):  # the fleet SIGKILLs a lost node's
            os.killpg(frozen, signal.SIGCONT)
    took = time.monotonic() - t0
    (lost,) = events_of(job, "NodeLost")
    assert "its agent has been silent for over 6s" in lost["message"], lost
    assert took < 6 + 12, f"lost after {took:.0f}s, the node timeout is 6 s"
    wait_for(job, lambda s: s["attempt"] >= 1 and s["state"] == "running", timeout=60)
    assert run_tg(["stop", str(job)], cwd=tmp_path).returncode == 0
    bg.finish(timeout=60)
    (rr,) = [rr for r in read_json("recovery", job)["running_records"]
             for rr in r["recover_records"]]
    assert rr["recover"] == "pod_reschedule", rr
    (moved,) = events_of(job, "PodRescheduled")  # its facts as data, not only in words
    assert {k: moved["data"][k] for k in ("rung", "used", "placement", "moved_slots")} == {
        "rung": "pod_reschedule", "used": 1, "placement": ["node-0", "node-2"],
        "moved_slots": [1]}, moved
    assert 5 <= rr["durations_s"]["detect"] <= took + 2, rr["durations_s"]
