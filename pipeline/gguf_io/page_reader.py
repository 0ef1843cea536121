"""A model's file pages read into the page cache ahead of their use, at the disk's speed.

One hint over a window's gigabytes does not do it: the kernel caps what one MADV_WILLNEED or
POSIX_FADV_WILLNEED reads at the device's read-ahead window (Linux's force_page_cache_ra), so
such a hint reads a few megabytes of them. Here a thread gives the hint piece by piece, each
piece the size of that window, in file order: the kernel reads them asynchronously, without
copying a byte into the process (a pread of the same bytes cost 1.7 s of CPU per GB here,
stolen from the compute), and the pages wait in the page cache, where the dequantizer's map
of the file finds them. A page not read yet when the dequantizer reaches it is faulted in by
the dequantizer itself, as without the hints: they change when bytes come off the disk, never
which bytes are used.
"""
import os
import queue
import threading
from pathlib import Path

DEFAULT_PIECE = 128 << 10      # the kernel's default read-ahead window


def piece_bytes(path: Path) -> int:
    """The most one hint reads of `path`: its block device's read-ahead window (for a
    partition, its disk's), or the kernel's default where there is none to read."""
    dev = os.stat(path).st_dev
    node = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    for queue_dir in (node / "queue", node.resolve().parent / "queue"):
        setting = queue_dir / "read_ahead_kb"
        if setting.is_file() and int(setting.read_text()) > 0:
            return int(setting.read_text()) << 10
    return DEFAULT_PIECE


def merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """[start, end) byte ranges -> the same bytes as sorted ranges, touching ones joined."""
    out: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


class PageReader:
    """A thread that asks the kernel for queued byte ranges of files, in the order queued."""

    def __init__(self):
        self._pieces: queue.SimpleQueue = queue.SimpleQueue()   # (fd, offset, length)
        self._thread: threading.Thread | None = None
        self._files: dict[Path, tuple[int, int]] = {}           # path -> (fd, piece bytes)

    def read(self, path: Path, ranges: list[tuple[int, int]], limit: int) -> int:
        """Queue the ranges of `path` (at most `limit` bytes of them, the first in file order);
        returns the bytes queued. Where the system has no such hint, nothing is queued."""
        if not hasattr(os, "posix_fadvise"):
            return 0
        fd, piece = self._file(path)
        queued = 0
        for start, end in merged(ranges):
            end = min(end, start + limit - queued)
            for offset in range(start, end, piece):
                self._pieces.put((fd, offset, min(piece, end - offset)))
            queued += max(0, end - start)
            if queued >= limit:
                break
        if self._thread is None or not self._thread.is_alive():   # a forked process has no thread
            self._thread = threading.Thread(target=self._run, name="page-reader", daemon=True)
            self._thread.start()
        return queued

    def forget(self, path: Path, start: int, end: int) -> None:
        """Drop bytes [start, end) of `path` from the page cache: bytes a pass has used and will
        not read again, whose pages would otherwise crowd out those read ahead (under memory
        pressure the kernel gives up reading ahead before it evicts older pages)."""
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(self._file(path)[0], start, end - start, os.POSIX_FADV_DONTNEED)

    def _file(self, path: Path) -> tuple[int, int]:
        """(descriptor, hint size) of `path`, opened once."""
        if path not in self._files:
            self._files[path] = os.open(path, os.O_RDONLY), piece_bytes(path)
        return self._files[path]

    def _run(self) -> None:
        while True:
            self.advise(*self._pieces.get())

    def advise(self, fd: int, offset: int, length: int) -> None:
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_WILLNEED)


PAGE_READER = PageReader()
