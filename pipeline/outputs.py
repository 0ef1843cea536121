"""Task output folders: atomic completion, one writer at a time, clear disk errors.

A task writes into `<out>.partial/` (kept across crashes, so work done chunk by chunk can be
resumed) and completes by writing `manifest.json` there and renaming the folder to `<out>/`.
A folder without its manifest is never taken as complete. A lock per output keeps a second
process from writing the same output at the same time (locks live in `<run root>/.locks/`).
"""
import contextlib
import errno
import fcntl
import json
import os
import shutil
from pathlib import Path

from .errors import UserError

MANIFEST = "manifest.json"


def partial_dir(out: Path) -> Path:
    return out.with_name(out.name + ".partial")


def begin(out: Path, params: dict) -> Path:
    if out.exists():  # an earlier output whose data was removed (never a complete one: the
        shutil.rmtree(out)  # caller holds the output's lock and found it incomplete)
    work = partial_dir(out)
    work.mkdir(parents=True, exist_ok=True)
    write_json(work / "params.json", params)
    return work


def commit(out: Path, manifest: dict, on_written=lambda: None) -> None:
    work = partial_dir(out)
    write_json(work / MANIFEST, manifest)
    on_written()
    os.replace(work, out)


def is_complete(out: Path) -> bool:
    return (out / MANIFEST).is_file()


def read_manifest(out: Path) -> dict:
    return json.loads((out / MANIFEST).read_text())


def remove_data(out: Path, name: str, flag: str) -> bool:
    """Delete `out/name`, recording it in the manifest first so the output reads incomplete;
    unless a task (of any process) is reading it: then it stays."""
    with open(_lock_path(out, "readers"), "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        manifest = read_manifest(out)
        write_json(out / MANIFEST, {**manifest, flag: True})
        shutil.rmtree(out / name, ignore_errors=True)
        return True


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def append_line(path: Path, line: str) -> None:
    with open(path, "a") as f:
        f.write(line + "\n")


def free_bytes(root: Path) -> int:
    root = Path(root).resolve()
    while not root.exists():
        root = root.parent
    return shutil.disk_usage(root).free


@contextlib.contextmanager
def locked(out: Path, what: str, wait: bool = False):
    """Hold a lock on `out` while the task runs. A second process gets a clear error, or with
    `wait` (workers of one central scheduler, which may hold two tasks with one output) waits."""
    lock_path = _lock_path(out)
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(lock_path, "a")
    except OSError as e:
        raise UserError(f"cannot write under {out.parent}: {e.strerror}") from None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            raise UserError(f"{what} is already running in another process (it holds {lock_path}); "
                            f"wait for it, or stop it and rerun") from None
        yield


@contextlib.contextmanager
def reading(out: Path):
    """A shared lock on `out` while a consumer reads it: its data is not removed meanwhile."""
    lock_path = _lock_path(out, "readers")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_SH)
        yield


def _lock_path(out: Path, kind: str = "lock") -> Path:
    """`lock`: held by the task producing `out`; `readers`: shared by tasks reading it."""
    return out.parent.parent / ".locks" / f"{out.parent.name}.{out.name}.{kind}"


@contextlib.contextmanager
def disk_errors(run_root: str):
    """A full or unwritable disk ends the task with one line; completed chunks stay."""
    try:
        yield
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise UserError(f"no space left under {run_root}: free some and rerun the same command "
                            f"(completed work is kept)") from None
        if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR):
            raise UserError(f"cannot write under {run_root}: {e.strerror} ({e.filename})") from None
        raise
