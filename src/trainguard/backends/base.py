"""What a backend does for a multi-node job: name its nodes, start an agent on each, say
when an agent's process ended or the engine marks a node bad, and isolate a node."""

from __future__ import annotations

from typing import Protocol

AGENT_ENDED = "its agent process ended"  # why a node is lost when its agent's process ended


class AgentHandle(Protocol):
    node: str

    @property
    def pid(self) -> int | None:
        """The local process standing for the agent (the agent itself, or its srun)."""

    def ended(self) -> bool:
        """True once the agent's process (or the step running it) has ended."""

    def why_ended(self) -> str:
        """Once ended(): what ended, for the node's NodeLost event (AGENT_ENDED, or a Slurm
        step's end with srun's words: the agent itself may run on)."""

    def cancelled(self) -> str | None:
        """The cluster's words when it cancelled the agent's step (a requeue, a time limit),
        said with the stop it brings; None when it did not."""

    def kill(self, wait: bool = True) -> None:
        """End the agent's process (or its step); `wait` False: without waiting for it to
        end (a lost node's srun waits out Slurm's KillWait for a step on a dead node)."""


class Backend(Protocol):
    name: str

    def node_names(self) -> list[str]:
        """Every node the job may use (placed + spare), in placement order."""

    def start_agent(self, node: str, argv: list[str]) -> AgentHandle: ...

    def adopt_agent(self, node: str, pid: int | None) -> AgentHandle:
        """A handle on an agent an earlier controller started (a restarted controller)."""

    def bad_nodes(self) -> dict[str, str]:
        """Nodes the engine itself reports as down or failing: node -> its state."""

    def isolate(self, node: str, reason: str) -> str:
        """Keep the node out of the job (and, where permitted, out of the cluster); returns
        what was done, for the NodeIsolated event."""

    def close(self) -> None: ...
