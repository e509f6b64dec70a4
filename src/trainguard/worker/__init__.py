"""Worker-side helpers, imported by training scripts; never imports the launcher side."""
