"""A SIGTERM to the node agents of a multi-node job (node/term.py), on the local backend:

- to the agents and their workers, not the launcher (what Slurm's scancel, time limit or
  preemption does to an allocation the launcher is outside of: trainguard's own, a salloc
  shell): the job stopped, exit 143, with a save on the way out; never a success (review 52
  #1: `JobSucceeded`, exit 0, at step 47 of 2000);
- to one agent only (a person's `kill`, the cluster ending one node's step, a shutdown): its
  workers get SIGTERM and the grace period at once, not SIGKILL 15 s later (review 52 #2);
  the node leaves the job, not blamed (never drained), its ranks moved to the spare; the
  stop is the cause, not the peers' gloo error (e27fceb4), and not ranks that "ended their
  script early" when the script's SIGTERM handler exits 0 (review 53 #1: restart no, the job
  failed); no restart is placed on the leaving node (review 53 #2), nor on a spare whose
  agent got SIGTERM before (review 54 #1: the move chose it, lost it at once, then queued).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
from pathlib import Path

import psutil

from tests.integration.conftest import EXAMPLE, read_json
from tests.integration.multinode import Background, events_of, job_args, node, wait_for


def sigterm(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)


def test_agents_and_workers_signalled_without_the_launcher_stop_the_job(
        tmp_path: Path) -> None:
    job = tmp_path / "job"
    args = job_args(job, "--save-on-exit", steps=3000)
    args[args.index("--ckpt-every") + 1] = "1000"  # the save on the way out is the only one
    bg = Background(args, tmp_path)
    status = wait_for(job, lambda s: (s["last_progress"]["step"] or 0) >= 12)
    agents = [node(status, n)["agent_pid"] for n in ("node-0", "node-1")]
    ranks = [r["pid"] for r in status["ranks"]]
    sigterm([*agents, *ranks])  # every process of the "steps", as slurmstepd signals them
    code, out = bg.finish(timeout=90)
    assert code == 128 + signal.SIGTERM, out[-4000:]
    (stopped,) = events_of(job, "JobStopped")
    assert stopped["message"].startswith("stopped from outside: the node agents of node-0, "
                                         "node-1 got a SIGTERM this launcher did not send"), stopped
    assert "JobSucceeded" not in [e["reason"] for e in read_json("events", job)]
    # the save on the way out is durable, the newest (a relaunch resumes there) and in the
    # events (its commit, said just before the stop, was lost in 2 of 6 runs until 37bc0e3d)
    latest = (job / "checkpoints" / "latest").read_text().strip()
    assert int(latest.removeprefix("step-")) >= 12, latest
    (saved,) = events_of(job, "CheckpointSaved")
    assert "on the way out" in saved["message"], saved
    assert saved["data"]["step"] == int(latest.removeprefix("step-")), (saved, latest)
    final = read_json("status", job)
    assert final["state"] == "stopped" and final["exit_code"] == 143
    assert {r["state"] for r in final["ranks"]} == {"stopped"}, final["ranks"]


# the example with a SIGTERM handler that exits 0 (a common "clean up, then exit" handler)
EXITS_0_ON_SIGTERM = f"""import os, runpy, signal, sys
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
sys.argv[0] = {str(EXAMPLE)!r}
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_one_agent_signalled_alone_stops_its_workers_at_once_and_its_node_leaves_the_job(
        tmp_path: Path) -> None:
    job = tmp_path / "job"
    script = tmp_path / "exits_0_on_sigterm.py"
    script.write_text(EXITS_0_ON_SIGTERM)
    args = job_args(job, "--spare-nodes", "2", steps=40)
    args[args.index(str(EXAMPLE))] = str(script)
    bg = Background(args, tmp_path)
    status = wait_for(job, lambda s: (s["last_progress"]["step"] or 0) >= 8)
    sigterm([node(status, "node-2")["agent_pid"]])  # the first spare's agent: it leaves
    status = wait_for(job, lambda s: node(s, "node-2")["state"] == "lost")
    assert (s := node(status, "node-2"))["reason"] == ("its agent got SIGTERM from outside the "
                                                       "launcher (a spare)"), s
    agent = node(status, "node-1")["agent_pid"]
    workers = [psutil.Process(r["pid"]) for r in status["ranks"] if r["node"] == "node-1"]
    sigterm([agent])
    _, alive = psutil.wait_procs(workers, timeout=4)  # (the grace is 5 s: SIGTERM, not
    assert not alive, alive  # SIGKILL after the grace + 5 s, as review 52 #2 saw)
    code, out = bg.finish(timeout=120)
    assert code == 0, out[-4000:]
    spare, lost = events_of(job, "NodeLost")
    assert spare["involved"]["node"] == "node-2" and "not drained" in spare["message"], spare
    assert lost["involved"]["node"] == "node-1", lost
    assert "its agent got SIGTERM from outside the launcher" in lost["message"], lost
    assert "not drained: its agent was ended from outside (SIGTERM)" in lost["message"], lost
    (moved,) = events_of(job, "PodRescheduled")
    assert "its ranks move to spare node-3" in moved["message"], moved
    (restarted,) = events_of(job, "WorkersRestarted")  # the move's, not a restart in place
    assert "(pod_reschedule, attempt 1)" in restarted["message"], restarted
    # the cause is node-1's leaving, not the gloo error its peers printed about it
    (diag,) = events_of(job, "FailureDiagnosed")
    assert diag["message"].startswith("other (infrastructure, restart helps: yes): node node-1 "
                                      "was lost: its agent got SIGTERM"), diag["message"]
    assert "The node is not blamed" in diag["message"], diag["message"]
    # a stop of the launcher's lists what it stopped, not what the agent's SIGTERM had (when
    # the peers' failure is seen first: else the node loss stops them, with no such event)
    for stopped in events_of(job, "WorkersStopped"):
        ranks = re.search(r"rank\(s\) ([\d, ]+)", stopped["message"])
        assert ranks is None or {2, 3}.isdisjoint(map(int, ranks[1].split(", "))), stopped
    final = read_json("status", job)
    assert {r["state"] for r in final["ranks"]} == {"succeeded"}, final["ranks"]
    assert {r["node"] for r in final["ranks"]} == {"node-0", "node-3"}, final["ranks"]
    assert "got SIGTERM" in (job / "cluster" / "node-1.agent.log").read_text()
