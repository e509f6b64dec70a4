"""The node agent's side: one process per node (agent, processes, logs, liveness)."""
