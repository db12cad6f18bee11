class KitError(Exception):
    """A user-facing failure: one line that names the cause and the fix."""
