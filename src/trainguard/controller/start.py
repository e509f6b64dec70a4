"""What the node agents get to start an attempt's workers (StartWorkers from the job spec),
and the event that says what started."""

from __future__ import annotations

import os

from trainguard.controller.recorder import Recorder
from trainguard.protocol import NodeReport, StartWorkers, WorkerAssignment
from trainguard.records import Reason, StartType
from trainguard.worker.contract import (
    ENV_AUTO_RESUME,
    ENV_GRACE,
    ENV_IN_PROCESS,
    ENV_IN_PROCESS_TIMEOUT,
    ENV_MEMORY_EVERY,
    ENV_MEMORY_PEER,
    ENV_PG_GENERATION,
    ENV_SAVE_ON_EXIT,
    ENV_STEP_RETRY,
    ENV_STEP_RETRY_TIMEOUT,
)


def start_command(rec: Recorder, attempt: int, port: int, addr: str, *, all_ranks: bool,
                  in_process: bool) -> StartWorkers:
    """The attempt's StartWorkers: every rank of the job (`all_ranks`: the fleet splits them
    by node), or this node's."""
    spec, paths = rec.spec, rec.paths
    n = spec.nproc_per_node
    base = spec.node_rank * n
    ranks = range(spec.world_size) if all_ranks else range(base, base + n)
    return StartWorkers(
        run_id=spec.run_id, attempt=attempt,
        argv=[*rec.argv, *spec.restart_args] if attempt > 0 else rec.argv,
        env={**auto_resume_env(spec.auto_resume),
             ENV_GRACE: f"{spec.grace_period_s:g}",
             ENV_SAVE_ON_EXIT: "1" if spec.save_on_exit else "0",
             ENV_STEP_RETRY: "1" if spec.operator_reexecution else "0",
             ENV_STEP_RETRY_TIMEOUT: f"{spec.step_retry_timeout_s:g}",
             ENV_IN_PROCESS: "1" if in_process else "0",
             ENV_IN_PROCESS_TIMEOUT: f"{spec.in_process_timeout_s:g}",
             ENV_PG_GENERATION: "0",  # never one inherited from the launcher's env
             ENV_MEMORY_EVERY: str(spec.memory_every),
             ENV_MEMORY_PEER: "1" if spec.memory_every and spec.nnodes > 1 else "0"},
        # the fleet adds each slot's moves; one node's job adds those of launches before
        workers=[WorkerAssignment(rank=r, local_rank=r % n, start_count=attempt + 1,
                                  schedule_count=rec.launches + (
                                      0 if all_ranks else rec.slot_moves.get(spec.node_rank, 0)))
                 for r in ranks],
        world_size=spec.world_size, group_rank=spec.node_rank,
        group_world_size=spec.nnodes, master_addr=addr,
        master_port=port, max_restarts=spec.max_restarts, grace_s=spec.grace_period_s,
        log_dir=str(paths.log_dir), job_dir=str(paths.job_dir),
        checkpoint_dir=str(paths.checkpoint_dir), cwd=os.getcwd(),
        standby=spec.standby_workers, prewarm_imports=list(spec.prewarm_imports))


def started(report: NodeReport, start_type: StartType, attempt: int, port: int,
            world: int, resume_note: str = "") -> tuple[Reason, str]:
    """JobRunning (a first start, a relaunch) or WorkersRestarted, and its message
    (`resume_note`: what a restart resumes from, `from_scratch`'s)."""
    pids = ", ".join(f"rank {w.rank}: pid {w.pid}{' (standby)' if w.standby else ''}"
                     for w in report.workers)
    if start_type in (StartType.FIRST_START, StartType.RELAUNCH):
        return Reason.JOB_RUNNING, f"started {len(report.workers)} worker(s) ({pids}), port {port}"
    n = len(report.workers)  # a node lost meanwhile starts none of its ranks: not "the job" (F13)
    return Reason.WORKERS_RESTARTED, (
        f"the job has been restarted ({start_type.value}, attempt {attempt}):"
        f"{f' only {n} of {world} rank(s) started:' if n < world else ''} {pids}, port {port}"
        f"{resume_note}")


def resume_note(rec: Recorder) -> str:
    """`from_scratch` of the job so far."""
    return from_scratch(rec.messages.knows_a_checkpoint(), rec.spec.auto_resume,
                        rec.messages.snapshot_taken)


def from_scratch(knows_a_checkpoint: bool, auto_resume: str | None,
                 memory_snapshots: bool) -> str:
    """A restart's note when trainguard knows of nothing it resumes from: no checkpoint
    committed through trainguard.checkpoint or an integration, none resumed from, and no
    memory snapshot taken (`memory_snapshots`: a rank said it took one, the restart may
    resume from it; not the --memory-every setting: a plain script under the llm preset takes
    none, review 49 #8) (walk-through 39 #6: a plain HF script restarted from step 0 and
    nobody said so); '' otherwise. Only "unless": a script may resume from its own."""
    if knows_a_checkpoint or memory_snapshots:
        return ""
    hint = "" if auto_resume else (
        " (an HF Trainer or Lightning script resumes exactly under --auto-resume hf|lightning: "
        "docs/integrations.md)")
    return ("; no checkpoint of this job is known (none committed through trainguard.checkpoint "
            "or a trainer integration, none resumed from): the script starts again from its "
            f"beginning unless it resumes from checkpoints of its own{hint}")


def auto_resume_env(framework: str | None) -> dict[str, str]:
    """`--auto-resume`: the site hook first on the workers' PYTHONPATH, and its framework."""
    if framework is None:
        return {}
    from trainguard.integrations.autoresume import site_dir

    path = os.pathsep.join(p for p in (site_dir(), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path, ENV_AUTO_RESUME: framework}
