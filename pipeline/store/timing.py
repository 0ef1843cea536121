"""Where a task's time goes (weight load, boundary read, compute, write) and its peak memory."""
import contextlib
import resource
import sys
import time
from collections import defaultdict
from pathlib import Path

import fsspec

from ..model.process import trim


class Stopwatch:
    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def __call__(self, part: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[part] += time.perf_counter() - start


STATUS, CLEAR_REFS = Path("/proc/self/status"), Path("/proc/self/clear_refs")


def reset_peak_rss() -> None:
    """Hand freed heap back to the system and start a new peak-RSS measurement, so that each
    task run in one worker process has its own (Linux: malloc_trim, then writing 5 to
    clear_refs resets VmHWM; elsewhere the peak is the process's)."""
    trim()
    try:
        CLEAR_REFS.write_text("5")
    except OSError:
        pass


def peak_rss_mb() -> float:
    """Peak resident memory since the last reset_peak_rss (Linux), else of the whole process."""
    try:
        for line in STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2**10
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, KiB elsewhere


def reset_device_peak(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.reset_peak_memory_stats(device)


def device_peaks_mb(device: str) -> dict:
    """Peak memory on a CUDA device since the last reset, for a task's manifest: what torch's
    tensors took (`device_peak_mb`) and what its caching allocator reserved
    (`device_reserved_mb`, what runs out first); None on the CPU."""
    if not device.startswith("cuda"):
        return {"device_peak_mb": None, "device_reserved_mb": None}
    import torch

    return {"device_peak_mb": torch.cuda.max_memory_allocated(device) / 2**20,
            "device_reserved_mb": torch.cuda.max_memory_reserved(device) / 2**20}


def folder_bytes(path) -> int:
    """Bytes stored under a folder, local or on an object store."""
    fs, where = fsspec.core.url_to_fs(str(path))
    return fs.du(where)
