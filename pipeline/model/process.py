"""Settings of a process that computes tasks, made once before its first computation.

- The C heap keeps memory freed inside a task for the next tensor (below).
- MKL's vector math functions, which torch uses for exp, tanh, sin, cos, log, sqrt and erf
  on the CPU, are first called on one thread. A first call made by several threads at once
  sometimes leaves one of them on another code path for the whole process (seen on a Xeon with
  AVX-512: in about one process of ten, the second thread's half of `torch.exp` differed by an
  ulp), and then a pass resumed in a new process would not give the bit-identical result.

The C heap: glibc gives each allocation above its mmap threshold (at most 32 MiB) fresh pages from the
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


# the functions torch hands to MKL on the CPU (aten/src/ATen/cpu/vml.h)
VECTOR_MATH = ("exp", "log", "log2", "log10", "sqrt", "sin", "cos", "tan", "tanh", "asin", "acos", "atan",
               "erf", "erfc", "erfinv", "trunc")


@functools.cache
def prepare_for_compute() -> None:
    import torch

    keep_freed_memory()
    for dtype in (torch.float32, torch.float64):
        x = torch.full((64,), 0.5, dtype=dtype)
        for name in VECTOR_MATH:
            getattr(torch, name)(x)
