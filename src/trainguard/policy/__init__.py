"""Pure decisions: what follows an incident."""
