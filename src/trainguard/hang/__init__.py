"""Hangs: every rank's stack (py-spy) when a hang is confirmed, and the rank to blame."""
