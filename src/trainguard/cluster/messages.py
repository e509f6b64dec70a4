"""What a node agent process is told at start (AgentConfig) and the ops it serves. Pure data."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

# ops the agent serves: body in -> body out
OP_START = "start"  # StartWorkers -> NodeReport
OP_STOP = "stop"  # StopWorkers -> NodeReport
OP_DUMP = "dump"  # DumpStacks -> {"dumps": [StackDump]}
OP_PORT = "port"  # {} -> {"port": int}: a port free on this node now (the rendezvous)
OP_PRECHECK = "precheck"  # PrecheckConfig -> PrecheckReport
OP_EXIT = "exit"  # {"grace_s": float} -> {}: stop the workers and end the agent


class AgentConfig(BaseModel):
    """Written by the controller to JOB_DIR/cluster/agent.json; read by every agent."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str
    controller_file: str = Field(description="JSON {host, port} of the controller; re-read "
                                 "before each reconnect (a restarted controller may move)")
    token_file: str
    step_pattern: str
    marker: str
    redirects: dict[int, int] = Field(default_factory=dict)
    ranks_filter: list[int] | None = None
    report_interval_s: float = Field(0.25, gt=0, description="NodeReport pushes")
    heartbeat_s: float = Field(1.0, gt=0, description="beats, also while a command runs")
    orphan_timeout_s: float = Field(600.0, gt=0, description="without a controller this long, "
                                    "the agent stops its workers and ends")
    node_addr: str | None = Field(None, description="the address other nodes reach this one "
                                  "at (default: the one its controller connection uses)")
