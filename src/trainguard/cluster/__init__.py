"""Multi-node jobs: the controller's hub, the node agents' network side, the fleet of nodes."""
