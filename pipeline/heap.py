"""The C heap of a worker process: memory freed inside a task is kept for the next tensor.

glibc gives each allocation above its mmap threshold (at most 32 MiB) fresh pages from the
kernel and hands them back on free, so every activation of a float32 feed-forward block
(40 MB on Qwen2.5-0.5B) is page-faulted and zeroed anew: 13% of that model's forward pass.
Served from the heap and kept there once freed, the pages are reused by the next tensor.
Between tasks the heap is trimmed (`trim`), so no task keeps another's memory.
glibc only; elsewhere (musl, macOS, Windows) the allocator is left as it is.
"""
import ctypes
import functools

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)
KEEP_BYTES = 1 << 30  # allocations below it come from the heap; free heap below it is kept


@functools.cache
def _glibc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def keep_freed_memory() -> None:
    if libc := _glibc():
        libc.mallopt(M_MMAP_THRESHOLD, KEEP_BYTES)
        libc.mallopt(M_TRIM_THRESHOLD, KEEP_BYTES)


def trim() -> None:
    """Hand the heap's free memory back to the system."""
    if libc := _glibc():
        libc.malloc_trim(0)
