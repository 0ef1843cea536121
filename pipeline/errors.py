"""The one exception type for bad input: its message is shown as a single line."""


class UserError(Exception):
    """A problem with what the user asked for (file, option, corpus), not a bug. What a damaged
    file puts in its message (a key or a name read from garbage) stays on the line: characters
    that are not printable are shown escaped, and at most LONGEST characters are shown."""
    LONGEST = 2000

    def __str__(self) -> str:
        text = super().__str__()
        if not text.isprintable():
            text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
        return text if len(text) <= self.LONGEST else text[:self.LONGEST] + " ..."
