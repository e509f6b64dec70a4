"""Where node agents run: local (virtual nodes on this machine) and Slurm."""
