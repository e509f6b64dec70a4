"""Node agents that outlived their launcher: which still run, and ending them, per backend.

A multi-node job's agents wait for a controller to take the job over (up to their orphan
timeout) and their workers train on meanwhile. `status`, `ls`, `diagnose` and the dashboard
ask which still run (their ranks are not `lost`); `stop` ends them. On the local backend an
agent is a process of this machine (checked by its pid, never a reused one); on Slurm it is
a step of the job's allocation, `trainguard-RUN_ID-agent-NODE`, which squeue lists while it runs
and scancel ends (walk-through 42 #8: under Slurm the ranks read `lost` though they
trained on, and nothing said how to take the job over or end them).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from trainguard.backends import slurm_cli
from trainguard.backends.local import R, live_agents, signal_agent
from trainguard.backends.slurm import SlurmBackend, agent_step
from trainguard.backends.slurm_cli import SlurmError
from trainguard.protocol import AgentConfig

SLURM_JOB_KEY = "slurm_job_id"  # the job store's meta: the allocation the agents run in
ALIVE_KEY = "controller_alive_at"  # ... and when the controller was last alive (ISO time),
ALIVE_EVERY_S = 60.0  # written this often (controller/recorder.py)
# an agent without a controller this long has ended (its orphan timeout): a lost job's
# agents are gone whatever Slurm says once its controller was last alive longer ago
GONE_AFTER_S = ALIVE_EVERY_S + AgentConfig.model_fields["orphan_timeout_s"].default + 60.0
OWN_JOB_KEY = "slurm_own_job"  # ... and the one trainguard made (cancelled at the job's end)
STEPS_TIMEOUT_S = 5.0  # one squeue call at most this long (status waits on it)
STEPS_TTL_S = 2.0  # the dashboard asks on every push: squeue at most this often per job
FAILED_TTL_S = 30.0  # ... and after a failure

# job -> (good until, its steps, or why Slurm could not be asked)
_steps_seen: dict[str, tuple[float, dict[str, str] | str]] = {}


def running_agents(meta: Mapping[str, Any], rows: Iterable[R]) -> list[R]:
    """The rows whose node agent still runs: the local backend's by their process, Slurm's
    by the steps of the job's allocation ([] for them when Slurm cannot be asked:
    unanswered() says why)."""
    rows = list(rows)
    alive = live_agents(rows)
    on_slurm = [r for r in rows if r.backend == SlurmBackend.name]
    job, run = meta.get(SLURM_JOB_KEY), str(meta.get("run_id") or "")
    if on_slurm and isinstance(job, str) and job:
        steps = _steps(job)
        alive += [r for r in on_slurm if not isinstance(steps, str)
                  and agent_step(run, r.name) in steps]
    return alive


@dataclass(frozen=True)
class AgentsSeen:
    """What is known of a lost job's node agents: the nodes whose agent still runs, and why
    Slurm could not say (None: it answered, or the job is not on Slurm)."""
    alive: list[str] = field(default_factory=list)
    unknown: str | None = None

    @property
    def may_run(self) -> bool:
        """Some agent runs, or may (Slurm could not be asked): its workers may train on."""
        return bool(self.alive or self.unknown)

    def kept(self, names: Iterable[str]) -> set[str]:
        """The nodes that keep their recorded states (their ranks train on, or may): every
        one when Slurm could not be asked, else those whose agent still runs (review 53 #6:
        an unanswered squeue read them all `lost`)."""
        return set(names) if self.unknown else set(self.alive)


def agents_seen(meta: Mapping[str, Any], rows: Iterable[R], lost: bool) -> AgentsSeen:
    """The agents of a `lost` job (the launcher gone) as `status` and the dashboard show
    them; nothing to ask of a job whose launcher runs or that ended."""
    if not lost:
        return AgentsSeen()
    rows = list(rows)
    return AgentsSeen(sorted(r.name for r in running_agents(meta, rows)),
                      _unknown(meta, unanswered(meta, rows)))


def _unknown(meta: Mapping[str, Any], why: str | None) -> str | None:
    """Why Slurm could not say, unless the agents have ended whatever it says: their
    controller was last alive more than GONE_AFTER_S ago (review 55 #3: where squeue never
    answers, a job lost months ago was never pruned and its checkpoint dir never free)."""
    try:
        at = datetime.fromisoformat(str(meta.get(ALIVE_KEY))).timestamp()
    except ValueError:  # none written (a store older than review 55) or garbled: unknown
        return why
    return None if time.time() - at > GONE_AFTER_S else why


def unanswered(meta: Mapping[str, Any], rows: Iterable[R]) -> str | None:
    """Why Slurm could not say whether the job's agents still run (squeue failed or timed
    out), or None: it answered, or the job has no agents on Slurm. Asked as running_agents
    asks (the same cached answer)."""
    job = meta.get(SLURM_JOB_KEY)
    if not isinstance(job, str) or not any(r.backend == SlurmBackend.name for r in rows):
        return None
    steps = _steps(job)
    return steps if isinstance(steps, str) else None


def end_agents(meta: Mapping[str, Any], rows: Iterable[R]) -> tuple[list[str], str | None]:
    """End the agents that still run (each one's guardian ends its workers): the local ones
    by SIGKILL to their process groups, Slurm's by scancel of their steps, or of the whole
    allocation when trainguard made it (its dead launcher would have cancelled it at the
    end). What was ended: 'node (pid N)', 'node (Slurm step J.S)', 'Slurm allocation J';
    and why Slurm could not say which steps run, when it could not (review 55 #2: read as
    none, `stop` said the job had ended)."""
    rows = list(rows)
    ended = [f"{r.name} (pid {r.agent_pid})" for r in live_agents(rows)
             if r.agent_pid is not None and signal_agent(r.agent_pid, r.name)]
    job, run = meta.get(SLURM_JOB_KEY), str(meta.get("run_id") or "")
    if not isinstance(job, str) or not any(r.backend == SlurmBackend.name for r in rows):
        return ended, None
    _steps_seen.pop(job, None)  # asked afresh, and again by whoever asks after
    asked = _steps(job)
    _steps_seen.pop(job, None)
    unknown = _unknown(meta, asked) if isinstance(asked, str) else None
    steps = {} if isinstance(asked, str) else asked
    agents = {r.name: steps[agent_step(run, r.name)] for r in rows
              if r.backend == SlurmBackend.name and agent_step(run, r.name) in steps}
    if meta.get(OWN_JOB_KEY) == job:  # the allocation is trainguard's (salloc'd for this
        try:  # job): its end ends every step, and nothing else would free it, steps or not
            slurm_cli.cancel(job, timeout_s=STEPS_TIMEOUT_S)  # (review 52 #4)
            return [*ended, *(f"{n} (Slurm step {s})" for n, s in agents.items()),
                    f"Slurm allocation {job}"], None
        except SlurmError:
            pass  # ended already, or this user may not: its steps one by one, then
    for name, step in agents.items():
        try:
            slurm_cli.cancel(step, timeout_s=STEPS_TIMEOUT_S)
        except SlurmError:
            continue  # it ended meanwhile, or this user may not: not said as ended
        ended.append(f"{name} (Slurm step {step})")
    return ended, unknown


def _steps(job: str) -> dict[str, str] | str:
    """The job's running steps, or why Slurm could not be asked, asked at most every
    STEPS_TTL_S (a failure is kept FAILED_TTL_S: a hung slurmctld costs each caller the
    timeout once), timed from the answer (review 52 #6: a slow squeue's entry had expired
    when stored)."""
    seen = _steps_seen.get(job)
    if seen is not None and time.monotonic() < seen[0]:
        return seen[1]
    try:
        steps = slurm_cli.job_steps(job, timeout_s=STEPS_TIMEOUT_S)
    except SlurmError as e:
        why = f"Slurm could not be asked whether they run ({_short(str(e))})"
        _steps_seen[job] = (time.monotonic() + FAILED_TTL_S, why)
        return why
    _steps_seen[job] = (time.monotonic() + STEPS_TTL_S, steps)
    return steps


def _short(error: str, limit: int = 300) -> str:
    """A Slurm error on one line, its output cut at a word (review 55 #3: cut at 300
    characters, its own `Fix: check ...` read `Fix: c`), its fix kept whole."""
    said, sep, fix = " ".join(error.split()).partition(" Fix: ")
    if len(said) > limit:
        said = said[:limit].rsplit(" ", 1)[0] + " ..."
    return f"{said}{sep}{fix}"


__all__ = ["ALIVE_EVERY_S", "ALIVE_KEY", "GONE_AFTER_S", "OWN_JOB_KEY", "SLURM_JOB_KEY",
           "AgentsSeen", "agents_seen", "end_agents", "running_agents", "unanswered"]
