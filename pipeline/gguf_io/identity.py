"""A model file's identity in milliseconds, and the sha256 of its tensors as a pass reads them.

Outputs are named by `FileIdentity.model_id`: every part's size and header (metadata and tensor
infos), and SAMPLES spans of SAMPLE_BYTES spread evenly over every tensor (a smaller tensor
whole). It reads kilobytes a tensor, not the file: two quantizations of one model differ in
their headers or, imatrix variants included, in every block's scales, so in the samples.

Two files alike but for bytes the samples miss share that name, never an output. Each tensor's
sha256 is taken from its bytes as the pass dequantizes them (`seen`, by a thread beside the
pass), kept in the models cache (a record a path, valid for the file instance it names: size,
modification and change times and inode; a rerun of that file reads nothing to know them), and
every output's manifest records `content` over the tensors its numbers depend on. A completed
output counts only while the file in hand gives that value again: a file the cache knows
nothing of (a copy, an edited file) has those tensors hashed once, which reads them. A tensor
the pass reads in part (the token embedding's used rows) is hashed whole when an output first
needs it.

A tensor's sha256 is that of its bytes; one of three or more dimensions (stacked experts, read
a slice of experts at a time) has the sha256 of its outer slices' sha256s, so that any slicing
gives one value.
"""
import functools
import hashlib
import json
import os
import queue
import struct
import threading
import weakref

from .. import paths

SAMPLES = 8             # spans of each tensor read for the identity
SAMPLE_BYTES = 4096     # bytes of each span
HEAD_PREFIXES = ("output.", "output_norm.")   # the output norm and LM head: read by Score only
HASHES_AHEAD = 4   # tensors read and waiting for their sha256 (their pages held until then) at most
IDLE_S = 0.2       # the hashing thread returns after this long with nothing queued


def sample_spans(info) -> list[tuple[int, int]]:
    """The [start, end) byte offsets of tensor `info` (a TensorInfo) that the identity reads."""
    if info.n_bytes <= SAMPLES * SAMPLE_BYTES:
        return [(info.offset, info.offset + info.n_bytes)]
    step = (info.n_bytes - SAMPLE_BYTES) // (SAMPLES - 1)
    return [(info.offset + k * step, info.offset + k * step + SAMPLE_BYTES) for k in range(SAMPLES)]


def file_instance(path) -> list:
    """What tells this file from another at its path, or an edited one: path, size, modification
    and change times (a modification time set back changes the latter) and inode."""
    st = os.stat(path)
    return [str(path), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def boundary_tensors(gguf, last: int) -> list[str]:
    """The tensors the hidden state at layer cut `last` depends on: those outside the blocks
    (the output norm's and head's aside) and the blocks before `last`."""
    def before(name: str) -> bool:
        block = name.split(".")[1]
        return not block.isdigit() or int(block) < last     # a `blk.` name without a number: counted always

    return [name for name in gguf.tensors
            if (before(name) if name.startswith("blk.") else not name.startswith(HEAD_PREFIXES))]


class FileIdentity:
    """One model (every part of a split one): its cheap identity, and its tensors' sha256s."""

    def __init__(self, gguf):
        self.gguf = weakref.proxy(gguf)    # the index holds this: no cycle keeping its maps alive
        self.instance = [file_instance(p) for p in gguf.parts]
        # one record a path: a file replaced there replaces its record (read only for its instance)
        key = hashlib.sha256(json.dumps([str(p) for p in gguf.parts]).encode()).hexdigest()[:32]
        self.record = paths.MODELS_CACHE / "digests" / f"{key}.json"
        self.read_at, self.kept = None, {}                # the record as last read: (mtime, size), its sha256s
        self.known: dict[str, str] = dict(self.recorded())    # tensor -> sha256
        self.slices: dict[str, dict[int, bytes]] = {}   # a tensor read in outer slices: theirs so far
        self.new_hasher()
        self.failed: BaseException | None = None

    @functools.cached_property
    def model_id(self) -> str:
        h = hashlib.sha256(b"layercycle model id 1")
        handles = [os.open(p, os.O_RDONLY) for p in self.gguf.parts]
        try:
            for part, fd in enumerate(handles):
                if hasattr(os, "posix_fadvise"):   # a sample reads its pages, not the kernel's read-ahead
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
                h.update(struct.pack("<Q", os.fstat(fd).st_size))
                h.update(self.gguf.header(part))
            for info in sorted(self.gguf.tensors.values(), key=lambda t: (t.part, t.offset)):
                for start, end in sample_spans(info):
                    h.update(os.pread(handles[info.part], end - start, start))
        finally:
            for fd in handles:
                os.close(fd)
        return h.hexdigest()

    def recorded(self) -> dict[str, str]:
        """The sha256s kept for this file, read again only when the record changed."""
        try:
            st = self.record.stat()
            if self.read_at != (st.st_mtime_ns, st.st_size):
                record = json.loads(self.record.read_text())
                self.read_at = st.st_mtime_ns, st.st_size
                self.kept = record.get("tensors", {}) if record.get("instance") == self.instance else {}
        except (OSError, ValueError):
            return {}
        return self.kept

    def seen(self, name: str, raw, first: int = 0, then=lambda: None) -> None:
        """Tensor `name`'s bytes `raw` (TensorInfo.raw's layout) as the pass read them: the whole
        tensor, or of one with three or more dimensions the outer slices from `first` on. They are
        hashed in a thread beside the pass (hashlib leaves the GIL), then `then()` runs (the
        tensor's pages released: released before, they would be read again)."""
        if name in self.known:
            then()
            return
        if self.pid != os.getpid():        # a forked process: its parent's thread and lock are not its own
            self.new_hasher()
        with self.lock:
            if not self.hashing:
                threading.Thread(target=self.hash_jobs, args=(self.jobs,), name="tensor-sha256", daemon=True).start()
                self.hashing = True
            self.jobs.put((name, raw, first, then))

    def new_hasher(self) -> None:
        """This process's queue of tensors to hash, its lock, and no hashing thread yet."""
        self.jobs, self.lock = queue.Queue(maxsize=HASHES_AHEAD), threading.Lock()
        self.pid, self.hashing = os.getpid(), False

    def hash_jobs(self, jobs: queue.Queue) -> None:
        """Hash what `seen` queues; return once nothing came for IDLE_S (a model opened and left,
        as a sweep or a fuzzer leaves thousands, keeps no thread and no mapping alive)."""
        while True:
            try:
                name, raw, first, then = jobs.get(timeout=IDLE_S)
            except queue.Empty:
                with self.lock:
                    if jobs.empty():
                        self.hashing = False
                        return
                continue
            try:
                self.hash(name, raw, first)
                then()
            except BaseException as e:   # raised in the pass's thread by flush()
                self.failed = e
            finally:
                del raw, then
                jobs.task_done()

    def flush(self) -> None:
        """Wait until every tensor seen so far is hashed."""
        if self.pid == os.getpid():
            self.jobs.join()
        if self.failed is not None:
            failed, self.failed = self.failed, None
            raise failed

    def hash(self, name: str, raw, first: int) -> None:
        if name in self.known:
            return
        if raw.ndim < 3:
            self.known[name] = hashlib.sha256(raw).hexdigest()
            return
        slices = self.slices.setdefault(name, {})
        for k in range(raw.shape[0]):
            if first + k not in slices:
                slices[first + k] = hashlib.sha256(raw[k]).digest()
        n = self.gguf.tensors[name].shape[0]
        if len(slices) == n:
            self.known[name] = hashlib.sha256(b"".join(slices[k] for k in range(n))).hexdigest()
            del self.slices[name]

    def content(self, names) -> str:
        """sha256 over the model's id and the sha256s of the tensors `names`, in file order: what an
        output whose numbers depend on them records. Tensors the pass has not read are read now."""
        infos = sorted((self.gguf.tensors[n] for n in names), key=lambda t: (t.part, t.offset))
        self.refresh()
        for t in infos:
            if t.name not in self.known:
                self.hash(t.name, self.gguf.raw(t.name), 0)
                self.gguf.release_pages(t.name)
        h = hashlib.sha256(self.model_id.encode())
        for t in infos:
            h.update(f"{t.name}:{self.known[t.name]}\n".encode())
        return h.hexdigest()

    def unread_bytes(self, names) -> int:
        """What `content(names)` would read of the file: the tensors whose sha256 is not known yet."""
        self.refresh()
        return sum(self.gguf.tensors[n].n_bytes for n in names if n not in self.known)

    def refresh(self) -> None:
        """The sha256s this process hashed and those other processes (a task's workers) kept since."""
        self.flush()
        self.known = self.recorded() | self.known

    def save(self) -> None:
        """Keep the sha256s known so far for later runs of this file (beside those another process kept)."""
        self.refresh()
        paths.keep_in_cache(self.record, json.dumps({"instance": self.instance, "tensors": self.known}))
