"""Settings of a process that computes tasks, made once before its first computation.

- The C heap keeps memory freed inside a task for the next tensor (heap.py).
- MKL's vector math functions, which torch uses for exp, tanh, sin, cos, log, sqrt and erf
  on the CPU, are first called on one thread. A first call made by several threads at once
  sometimes leaves one of them on another code path for the whole process (seen on a Xeon with
  AVX-512: in about one process of ten, the second thread's half of `torch.exp` differed by an
  ulp), and then a pass resumed in a new process would not give the bit-identical result.
"""
import functools

from .heap import keep_freed_memory

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
