"""Failpoints for crash tests: kill this process at a chosen point of a chosen task.

`LAYERCYCLE_FAULT="<point>@<task label>#<n>"` sends SIGKILL the n-th time (1-based) the named
point is reached in a task whose label starts with <task label>, e.g.
`chunk-written@LayerWindow [10..20)#2`; at `non-finite` it makes the chunk computed NaN instead
(what a model whose numbers overflow gives). Unset (always, outside the tests and the stress
command) it costs one dictionary lookup. Points:

- `non-finite`: a chunk is computed and checked; its values become NaN before the check

- `chunk-computed`: a chunk is computed, nothing of it written
- `mid-chunk-write`: a chunk's temporary file is half written (what Zarr leaves when killed)
- `chunk-written`: a chunk is stored
- `staged-removed`: a window in expert slices has its boundary whole and has removed its staged
  rows, not yet its slices' accumulators and marks
- `manifest-written`: the completion record is written, the folder not yet renamed
- `task-committed`: the task is complete, the next one not started
"""
import os
import signal
from pathlib import Path

POINTS = ("non-finite", "chunk-computed", "mid-chunk-write", "chunk-written", "staged-removed", "manifest-written",
          "task-committed")
_seen: dict[tuple[str, str], int] = {}


def failpoint(point: str, label: str, partial_file: Path | None = None) -> None:
    if reached(point, label):
        if partial_file is not None:
            partial_file.parent.mkdir(parents=True, exist_ok=True)
            partial_file.write_bytes(b"\x00" * 100)
        os.kill(os.getpid(), signal.SIGKILL)


def reached(point: str, label: str) -> bool:
    """Whether this is the n-th time `point` is reached in a task labelled as the spec says."""
    spec = os.environ.get("LAYERCYCLE_FAULT")
    if not spec:
        return False
    where, _, nth = spec.rpartition("#")
    want_point, _, want_label = where.partition("@")
    if point != want_point or not label.startswith(want_label):
        return False
    key = (point, want_label)
    _seen[key] = _seen.get(key, 0) + 1
    return _seen[key] == int(nth)
