"""The one exception type for bad input: its message is shown as a single line."""


class UserError(Exception):
    """A problem with what the user asked for (file, option, corpus), not a bug."""
