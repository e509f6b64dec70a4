"""Trainer integrations: exact, crash-safe resume for Hugging Face Trainer (`hf`) and
PyTorch Lightning (`lightning`) scripts, with a commit marker shared by both (`common`), and
the site hook that makes unmodified scripts resume (`trainguard run --auto-resume`,
`autoresume`). The frameworks are optional: `pip install trainguard[hf]` / `[lightning]`."""
