"""JobSpec: everything a job needs, from flags, a YAML job file and a scenario preset.

Precedence, lowest first: built-in defaults < `--scenario` preset < job file < flags.
Pure: parsing and validation only (reading the job file is the caller's job).
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from trainguard.presets import DEFAULT_STEP_PATTERN as DEFAULT_STEP_PATTERN
from trainguard.presets import PRESETS as PRESETS

Scenario = Literal["single-node", "multi-node", "llm"]
BackendName = Literal["local", "slurm"]

class Conflict(ValueError):
    """Settings that are fine alone but not together: `keys` are the fields involved."""

    def __init__(self, keys: tuple[str, ...], problem: str, fix: str) -> None:
        super().__init__(problem)
        self.keys = keys
        self.problem = problem
        self.fix = fix


class JobSpec(BaseModel):
    """One training job. Every field can be a flag (dashes) or a job-file key (underscores)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    entrypoint: str = Field(description="training script, module (-m) or program (--no-python)")
    args: list[str] = Field(default_factory=list, description="the script's own arguments")
    module: bool = Field(False, description="run entrypoint as a Python module (python -m)")
    no_python: bool = Field(False, description="run entrypoint as a program, not with python")
    nnodes: int = Field(1, ge=1, le=4096, description="number of nodes the job trains on")
    spare_nodes: int = Field(0, ge=0, le=4096, description="standby nodes, ready to replace a "
                             "faulty or lost one (pod-level rescheduling)")
    backend: BackendName = Field("local", description="where node agents run: local (virtual "
                                 "nodes on this machine) or slurm (srun in an allocation)")
    node_timeout_s: float = Field(10.0, ge=1, le=3600, description="a node agent silent this "
                                  "long is lost (agents beat every second)")
    reconnect_grace_s: float = Field(3.0, ge=0, le=3600, description="a node agent "
                                     "disconnected this long is lost (a blip is shorter)")
    max_pod_reschedules: int = Field(3, ge=0, le=128, description="pod-level rescheduling "
                                     "budget: a lost node replaced by a spare")
    max_job_reschedules: int = Field(3, ge=0, le=128, description="isolated job-level "
                                     "rescheduling budget: a faulty node isolated, every rank "
                                     "placed again")
    repeat_offender: int = Field(3, ge=0, le=128, description="a node implicated this many "
                                 "times within an hour is isolated (0: never)")
    queue_timeout_s: float = Field(300.0, ge=0, le=7 * 86400, description="without enough "
                                   "healthy nodes, wait this long for one, then fail")
    precheck: bool = Field(True, description="check every node before an attempt starts "
                           "(disk, /dev/shm, accelerators, python and torch, ports)")
    min_free_disk_mb: float = Field(1024.0, ge=0, description="pre-check: free space needed in "
                                    "the job and checkpoint dirs (MiB)")
    expect_accelerators: int = Field(0, ge=0, le=1024, description="pre-check: accelerators "
                                     "each node must see (0: not checked)")
    controller_host: str | None = Field(None, description="address the controller listens on "
                                        "for node agents (default: 127.0.0.1 for the local "
                                        "backend, this host's name for slurm)")
    metrics_port: int | None = Field(None, ge=0, le=65535, description="serve the job's "
                                     "Prometheus metrics live at http://HOST:PORT/metrics "
                                     "(0: any free port; default: not served)")
    metrics_host: str = Field("127.0.0.1", description="address the metrics endpoint binds "
                              "(loopback by default)")
    nproc_per_node: int = Field(1, ge=1, le=1024, description="worker processes per node")
    node_rank: int = Field(0, ge=0, description="this node's rank")
    master_addr: str = Field("127.0.0.1", description="address of rank 0's store")
    master_port: int | None = Field(None, ge=1, le=65535,
                                    description="first attempt's port; restarts take a fresh one")
    run_id: str = Field(default_factory=lambda: "tg-" + secrets.token_hex(4))
    job_dir: str | None = Field(None, description="default ./trainguard-runs/<run_id>")
    log_dir: str | None = Field(None, description="default JOB_DIR/logs")
    checkpoint_dir: str | None = Field(None, description="default JOB_DIR/checkpoints")
    redirects: dict[int, int] = Field(default_factory=dict,
                                      description="local rank -> streams kept off the console")
    local_ranks_filter: list[int] | None = Field(None, description="ranks shown on the console")
    monitor_interval: float = Field(0.1, gt=0, le=60, description="seconds between polls")
    scenario: Scenario | None = None
    max_restarts: int = Field(0, ge=0, le=128, description="0 = auto restart off; 1-128")
    unconditional_restart: bool = Field(False, description="restart on any non-zero exit")
    restart_backoff_s: float = Field(1.0, ge=0, le=3600)
    restart_backoff_max_s: float = Field(60.0, ge=0, le=86400)
    no_progress_limit: int = Field(3, ge=1, le=128,
                                   description="give up after this many attempts without progress")
    grace_period_s: float = Field(15.0, ge=0, le=3600,
                                  description="SIGTERM -> SIGKILL delay when stopping workers")
    save_on_exit: bool = Field(False, description="workers save a final checkpoint of the last "
                               "completed step when stopped (trainguard.checkpoint)")
    step_pattern: str = Field(DEFAULT_STEP_PATTERN,
                              description="regex whose first group is the step in a log line")
    hang_detection: bool = Field(True, description="watch for hangs (no progress while the "
                                 "workers still run); --no-hang-detection turns it off")
    hang_timeout_s: float | None = Field(None, gt=0, le=7 * 86400,
                                         description="a fixed no-progress time (s) that confirms "
                                         "a hang, instead of the one learned from the step cadence")
    hang_floor_s: float = Field(8.0, ge=1, le=86400, description="the learned hang threshold "
                                "is never below this (s)")
    hang_startup_s: float = Field(1800.0, ge=1, le=7 * 86400,
                                  description="allowance (s) before the first progress signal")
    restart_on_hang: bool = Field(False, description="stop and restart the ranks in place on a "
                                  "confirmed hang (at most 3 in a row; not from the restart "
                                  "budget)")
    operator_reexecution: bool = Field(False, description="a step that fails with a transient "
                                       "collective error is re-executed in the same processes "
                                       "(scripts using trainguard.worker.step.StepGuard)")
    step_retries: int = Field(1, ge=1, le=10, description="re-executions of one step before the "
                              "next rung (a process restart)")
    max_step_retries: int = Field(10, ge=0, le=100_000, description="step re-executions in the "
                                  "whole job")
    step_retry_timeout_s: float = Field(60.0, gt=0, le=3600, description="how long a rank waits "
                                        "for the re-formed group before it gives the step up")
    in_process_restart: bool = Field(True, description="when a rank dies or hangs, start only it "
                                     "again and let the other ranks re-enter their training "
                                     "function in place (scripts that call "
                                     "trainguard.run_resilient; others restart as processes)")
    in_process_timeout_s: float = Field(60.0, gt=0, le=3600, description="how long a surviving "
                                        "rank waits for the launcher's in-process restart")
    memory_every: int = Field(0, ge=0, le=1_000_000, description="steps between memory "
                              "snapshots (trainguard.checkpoint, in the node's /dev/shm): a "
                              "restart on the same node resumes from memory; 0: off")
    prewarm_imports: list[str] = Field(default_factory=list, description="modules the "
                                       "standby workers import besides torch's and the ones "
                                       "the job's workers are seen to import")
    standby_workers: bool = Field(True, description="keep a pre-warmed standby process per rank "
                                  "(torch and DDP's imports done) so that a restarted rank "
                                  "starts warm; --no-standby-workers turns it off")
    auto_resume: Literal["hf", "lightning"] | None = Field(
        None, description="make an unmodified Hugging Face Trainer (hf) or Lightning script "
        "resume from its newest committed checkpoint and report its steps")
    restart_args: list[str] = Field(default_factory=list, description="arguments added after "
                                    "the script's own on every attempt but the job's first "
                                    "(e.g. --init_from=resume)")

    @field_validator("redirects")
    @classmethod
    def _streams(cls, v: dict[int, int]) -> dict[int, int]:
        bad = {k: n for k, n in v.items() if not 0 <= n <= 3 or k < -1}
        if bad:
            raise ValueError(f"not local rank -> stream: {bad} (streams: 0 none, 1 stdout, "
                             "2 stderr, 3 both; e.g. {0: 3} or, for every rank, 3)")
        return v

    @field_validator("prewarm_imports")
    @classmethod
    def _modules(cls, v: list[str]) -> list[str]:
        bad = [m for m in v if not all(part.isidentifier() for part in m.split("."))]
        if bad:
            raise ValueError(f"not module names: {bad} (e.g. transformers, numpy.linalg)")
        return v

    @field_validator("job_dir", "log_dir", "checkpoint_dir")
    @classmethod
    def _not_empty(cls, v: str | None, info: Any) -> str | None:
        if v is not None and not v.strip():  # '' would be the cwd, or silently the default
            key = info.field_name
            raise Conflict((key,), f"is empty ({v!r})", f"omit {flag_name(key)} / '{key}' "
                           f"({JobSpec.model_fields[key].description}), or give a directory")
        return v

    @field_validator("step_pattern")
    @classmethod
    def _pattern_compiles(cls, v: str) -> str:
        try:
            compiled = re.compile(v)
        except re.error as e:
            raise ValueError(f"not a valid regular expression ({e})") from e
        if compiled.groups < 1:
            raise ValueError("needs one capture group around the step number, e.g. 'step (\\d+)'")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> JobSpec:
        if self.module and self.no_python:
            raise Conflict(("module", "no_python"), "cannot both be set",
                           "keep one: -m runs a Python module, --no-python runs a program")
        if self.restart_backoff_max_s < self.restart_backoff_s:
            raise Conflict(("restart_backoff_max_s", "restart_backoff_s"),
                           f"the cap {self.restart_backoff_max_s:g} s is below the first delay "
                           f"{self.restart_backoff_s:g} s",
                           f"raise --restart-backoff-max / 'restart_backoff_max_s' to at least "
                           f"{self.restart_backoff_s:g}, or lower --restart-backoff / "
                           f"'restart_backoff_s'")
        if self.restart_on_hang and not self.hang_detection:
            raise Conflict(("restart_on_hang", "hang_detection"), "a hang is never confirmed "
                           "with hang detection off, so it is never restarted",
                           "drop --restart-on-hang / 'restart_on_hang', or drop "
                           "--no-hang-detection / 'hang_detection: false'")
        if self.unconditional_restart and self.max_restarts == 0:
            raise Conflict(("unconditional_restart", "max_restarts"), "unconditional restarts "
                           "need a restart budget, and a max_restarts of 0 turns restarts off",
                           "set --max-restarts / 'max_restarts' to 1 or more, or drop "
                           "--unconditional-restart / 'unconditional_restart'")
        if self.multi_node and self.node_rank != 0:
            raise Conflict(("node_rank",), f"{self.node_rank} in a multi-node job",
                           "drop --node-rank / 'node_rank': a multi-node job has one "
                           "controller, which starts an agent on every node; run trainguard "
                           "once, on one node")
        if self.node_rank >= self.nnodes:
            raise Conflict(("node_rank", "nnodes"),
                           f"node rank {self.node_rank} needs {self.node_rank + 1} nodes "
                           f"or more, and the job has {self.nnodes}",
                           "drop --node-rank / 'node_rank' (trainguard needs it for no job: "
                           "a single-node job is node 0, and a multi-node job (--nnodes N) "
                           "is started once, with one command)")
        return self

    @property
    def multi_node(self) -> bool:
        """Agents on nodes of their own (a cluster), not in the launcher's process."""
        return self.nnodes > 1 or self.spare_nodes > 0 or self.backend != "local"

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    @property
    def restart_policy(self) -> RestartPolicy:
        return RestartPolicy(
            max_restarts=self.max_restarts,
            unconditional=self.unconditional_restart,
            backoff_s=self.restart_backoff_s,
            backoff_max_s=self.restart_backoff_max_s,
            no_progress_limit=self.no_progress_limit,
        )


@dataclass(frozen=True)
class RestartPolicy:
    """The knobs of policy.decide."""

    max_restarts: int = 0
    unconditional: bool = False
    unconditional_max_consecutive: int = 3  # the platform's rule: at most 3 in a row
    backoff_s: float = 1.0
    backoff_max_s: float = 60.0
    no_progress_limit: int = 3


FIELDS = tuple(JobSpec.model_fields)

# Fields whose flag is not simply `--` + the field name with dashes.
FLAG_NAMES = {
    "entrypoint": "the training script argument",
    "args": "the script's arguments",
    "restart_backoff_s": "--restart-backoff",
    "restart_backoff_max_s": "--restart-backoff-max",
    "grace_period_s": "--grace-period",
    "hang_detection": "--no-hang-detection",
    "hang_timeout_s": "--hang-timeout",
    "hang_floor_s": "--hang-floor",
    "hang_startup_s": "--hang-startup-timeout",
    "module": "-m/--module",
    "node_timeout_s": "--node-timeout",
    "reconnect_grace_s": "--reconnect-grace",
    "queue_timeout_s": "--queue-timeout",
    "precheck": "--no-precheck",
    "step_retry_timeout_s": "--step-retry-timeout",
    "in_process_restart": "--no-in-process-restart",
    "in_process_timeout_s": "--in-process-timeout",
    "standby_workers": "--no-standby-workers",
}


def flag_name(key: str) -> str:
    return FLAG_NAMES.get(key, "--" + key.replace("_", "-"))
