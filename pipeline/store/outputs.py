"""Task output folders: atomic completion, one writer at a time, clear disk errors.

An output is complete when its `manifest.json` exists; a folder without one is never taken as
complete. Output folders live under a run root that is a local path (NFS included) or an
object store given as an fsspec URL (`s3://bucket/prefix`):

- local: a task writes into `<out>.partial/` (kept across crashes, so work done chunk by chunk
  is resumed), writes the manifest there and renames the folder to `<out>/`. Locks are
  `flock`s on files in `<run root>/.locks/`, released by the system when a process dies.
- object store: there is no rename, so a task writes in place, chunk by chunk, and the
  manifest, one object written last, completes it. The writer's lock is an object created only
  if absent (a conditional put), removed when the task ends: a lease naming its holder and when
  it ends, renewed while the task runs (LAYERCYCLE_LEASE_S, 60 s by default); one whose lease
  ended (a host that died) or left by a killed process of the same host is taken over. Readers
  leave a marker object each while they read.
"""
import contextlib
import errno
import fcntl
import json
import logging
import math
import os
import shutil
import socket
import threading
import time
import uuid
from pathlib import Path

from ..errors import UserError
from ..paths import is_local, location

MANIFEST = "manifest.json"
log = logging.getLogger("layercycle")
POLL_S = 2.0  # how often a waiting worker looks at an object-store lock again
# an object-store lock is a lease of this many seconds, renewed every third of it while its task runs
LEASE_S = float(os.environ.get("LAYERCYCLE_LEASE_S", 60))
ATTEMPTS = "attempts.json"   # in a task's work folder: the seconds its earlier attempts computed


class Busy(UserError):
    """Another process holds the lock of the output this one was to compute."""


def failure_record(out):
    """Where a task records why its last attempt at `out` failed (beside it, outside its folder)."""
    return out.with_name(out.name + ".failed.json")


def partial_dir(out):
    return out.with_name(out.name + ".partial") if is_local(out) else out


def begin(out, params: dict):
    if (out / MANIFEST).exists():  # an earlier output whose data was removed (never a complete one:
        remove_tree(out)           # the caller holds the output's lock and found it incomplete)
    work = partial_dir(out)
    work.mkdir(parents=True, exist_ok=True)
    if is_local(work):
        for left in work.rglob("*.tmp"):   # a whole-file write a kill cut short
            left.unlink(missing_ok=True)
    write_json(work / "params.json", params)
    return work


def earlier_attempts(work) -> tuple[float, int]:
    """(seconds, count) of the earlier attempts at the output being written in `work`, and this
    one recorded as begun now. An attempt that was killed is counted to the last line of the
    task's journal (its last chunk); on an object store, where files carry no such time, none."""
    record = work / ATTEMPTS
    seconds, count = 0.0, 0
    if is_local(work) and record.is_file():
        earlier = json.loads(record.read_text())
        journal = work / "journal.log"
        last = journal.stat().st_mtime if journal.is_file() else earlier["started"]
        seconds, count = earlier["seconds"] + max(last - earlier["started"], 0.0), earlier["count"]
    if is_local(work):
        write_json(record, {"seconds": seconds, "count": count + 1, "started": time.time()})
    return seconds, count


def commit(out, manifest: dict, on_written=lambda: None, held=lambda: True) -> None:
    """Complete `out` with its manifest; `held()` (locked's) says the lock is still this process's:
    where another worker took its lease over, that one completes the output, not this one."""
    if not held():
        raise UserError(f"{out}: this process's lease on it ended while it computed (the store did not answer "
                        f"its renewals) and another worker took its task over")
    work = partial_dir(out)
    remove_file(work / ATTEMPTS)
    write_json(work / MANIFEST, manifest)
    on_written()
    if work != out:
        os.replace(work, out)


def is_complete(out) -> bool:
    return (out / MANIFEST).is_file()


def read_manifest(out) -> dict:
    return json.loads((out / MANIFEST).read_text())


def remove_tree(path) -> None:
    """Delete a folder, its manifest first, so that it never reads complete with data missing."""
    if is_local(path):
        shutil.rmtree(path, ignore_errors=True)
        return
    (path / MANIFEST).unlink(missing_ok=True)
    if path.exists():
        path.fs.rm(path.path, recursive=True)


def remove_data(out, name: str, flag: str) -> bool:
    """Delete `out/name`, recording it in the manifest first so the output reads incomplete;
    unless a task (of any process) is reading it: then it stays."""
    if is_local(out):
        with open(_lock_path(out, "readers"), "a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            return _remove_flagged(out, name, flag, readers=lambda: False)
    return _remove_flagged(out, name, flag, readers=lambda: _has_entries(_lock_path(out, "readers")))


def _has_entries(folder) -> bool:
    try:
        return any(folder.iterdir())
    except (FileNotFoundError, NotADirectoryError):  # an object store has no empty folders
        return False


def _remove_flagged(out, name: str, flag: str, readers) -> bool:
    # A reader first leaves its marker, then checks the manifest: it either sees the flag, or its
    # marker is seen here after the flag was written, and the data stays.
    manifest = read_manifest(out)
    write_json(out / MANIFEST, {**manifest, flag: True})
    if readers():
        write_json(out / MANIFEST, manifest)
        return False
    remove_tree(out / name)
    return True


def keep_data(out, why: str) -> None:
    """Mark `out`'s data as needed by runs still to come (a KL base's last boundary): it is then
    never removed once its consumer completed. The mark lives beside the locks, so it can be set
    before the output exists."""
    mark = _lock_path(out, "kept")
    if not mark.exists():
        make_parent(mark)
        mark.write_text(why + "\n")


def make_parent(path) -> None:
    """The folder a file is written into, on local disk (an object store has no folders, and
    making one there would create a missing bucket)."""
    if is_local(path):
        path.parent.mkdir(parents=True, exist_ok=True)


def is_kept(out) -> bool:
    return _lock_path(out, "kept").exists()


def record_once(path, data: dict) -> dict:
    """The record at `path`: `data` if none was written yet, else the first one written there
    (by any process, on any host sharing the run root)."""
    make_parent(path)
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    try:
        if not is_local(path):
            with path.fs.open(path.path, "xb") as f:   # a conditional put
                f.write(text.encode())
        elif not _link_whole(path, text):             # a file system without hard links
            with open(path, "x") as f:
                f.write(text)
        return data
    except FileExistsError:
        return json.loads(path.read_text())


def _link_whole(path: Path, text: str) -> bool:
    """Write `text` to a file of its own and link it at `path`, so that `path` appears whole and
    only where absent (FileExistsError otherwise); False where the file system has no hard links."""
    tmp = _temporary(path)
    tmp.write_text(text)
    try:
        os.link(tmp, path)
        return True
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV):
            raise
        return False
    finally:
        tmp.unlink()


def write_json(path, data: dict) -> None:
    write_bytes(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())


def write_bytes(path, data: bytes) -> None:
    """A file written whole or not at all."""
    if not is_local(path):  # one object, written whole or not at all
        path.write_bytes(data)
        return
    tmp = _temporary(path)
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _temporary(path: Path) -> Path:
    """A name beside `path` that no other writer uses, in this process or on another host
    sharing the folder (a pid alone repeats across hosts)."""
    return path.with_name(f"{path.name}.{uuid.uuid4().hex}.tmp")


def remove_file(path) -> None:
    """Delete a file where it exists."""
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def append_line(path, line: str) -> None:
    with path.open("a") as f:
        f.write(line + "\n")


def _existing(path) -> Path:
    """`path`, or the nearest folder above it that exists."""
    path = Path(path).resolve()
    while not path.exists():
        path = path.parent
    return path


def same_disk(a, b) -> bool:
    """Whether two local paths (that may not exist yet) lie on one file system."""
    return is_local(a) and is_local(b) and _existing(a).stat().st_dev == _existing(b).stat().st_dev


def free_bytes(root) -> int | None:
    """Free space on a local path's disk (the path may not exist yet); None on an object store."""
    return shutil.disk_usage(_existing(root)).free if is_local(root) else None


@contextlib.contextmanager
def locked(out, what: str, wait: bool = False):
    """Hold a lock on `out` while the task runs, yielding `held()`: whether it is still this
    process's (an object store's lease may be taken over). A second process gets a clear error,
    or with `wait` (workers of one central scheduler, which may hold two tasks with one output)
    waits."""
    lock_path = _lock_path(out)
    busy = (f"{what} is already running in another process (it holds {lock_path}); "
            f"wait for it, or stop it and rerun")
    if not is_local(out):
        with _object_lock(lock_path, busy, wait) as held:
            yield held
        return
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(lock_path, "a")
    except OSError as e:
        raise UserError(f"cannot write under {out.parent}: {e.strerror}") from None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            raise Busy(busy) from None
        yield lambda: True                 # an flock is released only with the process

@contextlib.contextmanager
def _object_lock(lock_path, busy: str, wait: bool):
    """A lease on an object store: the lock object names its holder and when its lease ends; a
    thread renews it while the task runs, and a lease past its end (a host that died) is taken
    over, in one line naming the old holder."""
    token, since = uuid.uuid4().hex, time.time()

    def lease() -> bytes:
        return json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "since": since,
                           "expires": time.time() + LEASE_S, "token": token}).encode()
    while True:
        try:
            with lock_path.fs.open(lock_path.path, "xb") as f:  # a conditional put: only if absent
                f.write(lease())
            break
        except (ValueError, NotImplementedError):
            raise UserError(f"the run root's filesystem ({lock_path.protocol}) cannot create a file only if "
                            f"it is absent, which the locks of a shared run root need") from None
        except FileExistsError:
            if _abandoned(lock_path):
                lock_path.unlink(missing_ok=True)
            elif wait:
                time.sleep(POLL_S)
            else:
                raise Busy(busy) from None
    stop, lost = threading.Event(), []
    renewing = threading.Thread(target=_renew, args=(lock_path, token, lease, stop, lost), daemon=True,
                                name="lease-renewal")
    renewing.start()
    try:
        yield lambda: not lost
    finally:
        stop.set()
        renewing.join()
        try:
            if _holder(lock_path).get("token") == token:
                lock_path.unlink(missing_ok=True)
        except Exception as e:   # noqa: BLE001 -- the lease then ends by itself
            log.warning(f"{lock_path}: the lock could not be removed ({e}); its lease ends in {LEASE_S:.0f} s")


def _renew(lock_path, token: str, lease, stop: threading.Event, lost: list) -> None:
    """Rewrite the lease every third of its length while this process holds it; a store that
    does not answer is asked again at the next renewal."""
    while not stop.wait(LEASE_S / 3):
        try:
            if _holder(lock_path).get("token") != token:
                log.warning(f"{lock_path}: this process's lease was taken over by another worker")
                lost.append(True)
                return
            with lock_path.fs.open(lock_path.path, "wb") as f:
                f.write(lease())
        except Exception as e:   # noqa: BLE001 -- any error of the store: try again at the next renewal
            log.warning(f"{lock_path}: the lease could not be renewed ({e})")


def _holder(lock_path) -> dict:
    """The lock's lease, read in one request: a ranged read of an object that its holder renews
    meanwhile fails its version check (S3's PreconditionFailed)."""
    try:
        return json.loads(lock_path.fs.cat_file(lock_path.path))
    except (FileNotFoundError, ValueError):
        return {}


def _abandoned(lock_path) -> bool:
    """A lock whose lease ended (its holder's host died or lost the store) or left by a process
    of this host that is gone (killed before it could remove it)."""
    holder = _holder(lock_path)
    if not holder:
        return False
    if holder.get("expires", math.inf) < time.time():
        log.warning(f"{lock_path}: the lease of {holder.get('host')} pid {holder.get('pid')} ended "
                    f"{time.time() - holder['expires']:.0f} s ago; taking its task over")
        return True
    if holder.get("host") != socket.gethostname():
        return False
    try:
        os.kill(int(holder["pid"]), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        pass
    return False


@contextlib.contextmanager
def reading(out, reader: str):
    """While `reader` (a consumer's output name) reads `out`, its data is not removed."""
    lock_path = _lock_path(out, "readers")
    if not is_local(out):
        marker = lock_path / reader
        marker.write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid()}))
        try:
            yield
        finally:
            marker.unlink(missing_ok=True)
        return
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_SH)
        yield


def _lock_path(out, kind: str = "lock"):
    """`lock`: held by the task producing `out`; `readers`: shared by tasks reading it (on an
    object store, a folder of markers); `kept`: its data stays (keep_data)."""
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
        if isinstance(e, (FileNotFoundError, PermissionError)) and not is_local(location(run_root)):
            raise UserError(f"cannot write under {run_root}: {e}") from None  # no bucket, no access
        raise
