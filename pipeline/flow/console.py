"""What a run prints while it works: one line for a user error, progress per task.

Installed by the first task that starts in a process (`install`, idempotent), not by importing
the package: a program that imports `pipeline` keeps its own logging as it was.
"""
import functools
import logging
import sys
import time

from ..errors import UserError

log = logging.getLogger("layercycle")
BAR = 30  # width of the terminal progress bar


class OneLineUserErrors(logging.Filter):
    """Luigi logs a failed task's exception with its traceback; a UserError gets one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, UserError):
            record.msg, record.args = f"layercycle: {exc}", ()
            record.exc_info, record.exc_text = None, None
        return True


@functools.cache
def install() -> None:
    logging.getLogger("luigi-interface").addFilter(OneLineUserErrors())
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


def show_progress(task, label: str, done: int, total: int, computed: int, tokens: int, started: float) -> None:
    """`done` of `total` chunks of `task`, `computed` of them (`tokens` tokens) since `started`:
    Luigi's status message and percentage, and a bar on a terminal (else a log line)."""
    spent = max(time.time() - started, 1e-9)
    rate, left = tokens / spent, (total - done) * spent / max(computed, 1)
    msg = f"{label}: chunk {done}/{total}, {rate:,.0f} tok/s, {left:.0f}s left"
    task.set_status_message(msg)
    task.set_progress_percentage(100 * done // total)
    if sys.stderr.isatty():  # one bar per task, redrawn in place
        bar = "#" * (BAR * done // total) + "-" * (BAR - BAR * done // total)
        print(f"\r[{bar}] {msg}", end="\n" if done == total else "", file=sys.stderr, flush=True)
    else:
        log.info(msg)
