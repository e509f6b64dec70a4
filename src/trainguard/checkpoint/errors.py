"""The checkpoint library's error."""


class CheckpointError(Exception):
    """A checkpoint cannot be saved or loaded; the message names the cause and the fix."""
