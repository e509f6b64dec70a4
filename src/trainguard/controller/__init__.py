"""The job controller's side: one per job (loop, recorder, store, fleet)."""
