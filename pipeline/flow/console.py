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


def show_progress(task, label: str, done: int, total: int, computed: int, tokens: int, started: float,
                  load_s: float) -> None:
    """`done` of `total` chunks of `task`, `computed` of them (`tokens` tokens) since `started`,
    after a load of `load_s` seconds: Luigi's status message and percentage, and a bar on a
    terminal (else a log line). A window task adds where the pass stands
    (`task.pass_position()`: layers before its window, in it, in the trunk, and the runs of a
    sweep still to come after this one)."""
    spent = max(time.time() - started, 1e-9)
    rate, left = tokens / spent, (total - done) * spent / max(computed, 1)
    msg = f"{label}: chunk {done}/{total}, {rate:,.0f} tok/s, {duration(left)} left"
    position = getattr(task, "pass_position", lambda: None)()
    if position is not None and position[1]:
        msg += "; " + pass_line(*position, done, total, rate, spent / max(computed, 1), left, load_s)
    task.set_status_message(msg)
    task.set_progress_percentage(100 * done // total)
    if sys.stderr.isatty():  # one bar per task, redrawn in place
        bar = "#" * (BAR * done // total) + "-" * (BAR - BAR * done // total)
        print(f"\r[{bar}] {msg}", end="\n" if done == total else "", file=sys.stderr, flush=True)
    else:
        log.info(msg)


def pass_line(before: int, here: int, n_layers: int, runs_after: int, done: int, total: int, rate: float,
              per_chunk: float, left: float, load_s: float = 0.0) -> str:
    """The pass as the window task at layers [before, before + here) of n_layers sees it, `done`
    of `total` chunks in at `per_chunk` seconds each after a load of `load_s`: layers done, the
    pass's tokens/s (the window's compute, spread over the trunk) and what is left of it, at this
    window's pace per layer, each layer's load counted once; in a sweep, what is left of it with
    `runs_after` more passes like this one."""
    per_layer = (total * per_chunk + load_s) / here   # one layer over the whole corpus, its load included
    pass_left = left + (n_layers - before - here) * per_layer
    line = (f"pass {before + here * done / total:.1f}/{n_layers} layers, {rate * here / n_layers:,.0f} tok/s, "
            f"{duration(pass_left)} left")
    if runs_after:
        line += f"; sweep {duration(pass_left + runs_after * n_layers * per_layer)} left ({runs_after} more runs)"
    return line


def duration(seconds: float) -> str:
    """4s, 12m05s, 3h07m."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
