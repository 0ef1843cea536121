"""ggml's CPU backend through ctypes (libggml-cpu.so of the llama.cpp build llama-perplexity comes
from, built on first use): each weight type's activation quantizer (`from_float` of its
vec_dot_type, the x86 SIMD code on this machine) and its dot product, the reference for
`--numerics llama-cpp`."""
import ctypes
import functools

import numpy as np

from pipeline.gguf_io.ggml_types import ggml_type, type_named
from pipeline.tools.llamacpp import ggml_cpu_library

from .ggml_reference import LLAMA_CPP_PYTHON, ggml, ggml_quantize
from .ggml_reference import traits as ggml_traits


class CpuTraits(ctypes.Structure):
    """ggml-cpu.h's struct ggml_type_traits_cpu."""
    _fields_ = [("from_float", ctypes.c_void_p), ("vec_dot", ctypes.c_void_p), ("vec_dot_type", ctypes.c_int),
                ("nrows", ctypes.c_int64)]


FROM_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
VEC_DOT = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                           ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


@functools.cache
def ggml_cpu() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(ggml_cpu_library(LLAMA_CPP_PYTHON)))
    lib.ggml_get_type_traits_cpu.restype = ctypes.POINTER(CpuTraits)
    lib.ggml_get_type_traits_cpu.argtypes = [ctypes.c_int]
    lib.ggml_cpu_init()
    return lib


def cpu_traits(type_name: str) -> CpuTraits:
    return ggml_cpu().ggml_get_type_traits_cpu(int(type_named(type_name))).contents


def quantize_row(x: np.ndarray, type_name: str) -> np.ndarray:
    """float32 [K] -> uint8 [K / block, type_size]: the row as ggml-cpu's from_float of `type_name`
    writes it (for Q8_0, Q8_1, Q8_K: quantize_row_q8_*, the SIMD code)."""
    from_float = cpu_traits(type_name).from_float   # first: builds the library where it is missing
    traits = ggml_traits(type_named(type_name))     # ggml's sizes (gguf-py's Q8_1 is an older layout)
    block, type_size = traits.blck_size, traits.type_size
    source = np.ascontiguousarray(x, dtype=np.float32)
    out = np.zeros((source.size // block, type_size), dtype=np.uint8)
    FROM_FLOAT(from_float)(source.ctypes.data, out.ctypes.data, source.size)
    return out


def dot(weight_row: np.ndarray, x: np.ndarray, weight_type: str) -> float:
    """ggml's product of one float32 row, quantized to `weight_type` by ggml, with the float32
    activations `x`, as a matrix product on the CPU computes it: `x` quantized to the weight
    type's vec_dot_type, then its vec_dot."""
    traits = cpu_traits(weight_type)
    w = ggml_quantize(weight_row.reshape(1, -1), type_named(weight_type))
    y = quantize_row(x, ggml_type(traits.vec_dot_type).name)
    s = np.zeros(1, dtype=np.float32)
    VEC_DOT(traits.vec_dot)(x.size, s.ctypes.data, 0, w.ctypes.data, 0, y.ctypes.data, 0, 1)
    return float(s[0])



class InitParams(ctypes.Structure):
    """ggml.h's struct ggml_init_params."""
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


GGML_TYPE_F32, GGML_TYPE_I32 = 0, 26


@functools.cache
def _graph_api():
    cpu = ggml_cpu()   # first: builds the libraries where they are missing
    base = ggml()
    base.ggml_init.restype, base.ggml_init.argtypes = ctypes.c_void_p, [InitParams]
    for name, args in (("ggml_new_tensor_1d", [ctypes.c_int, ctypes.c_int64]),
                       ("ggml_new_tensor_2d", [ctypes.c_int, ctypes.c_int64, ctypes.c_int64]),
                       ("ggml_new_tensor_3d", [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]),
                       ("ggml_rope_ext", [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                          ctypes.c_int] + [ctypes.c_float] * 6),
                       ("ggml_rms_norm", [ctypes.c_void_p, ctypes.c_float]),
                       ("ggml_new_graph", [])):
        getattr(base, name).restype, getattr(base, name).argtypes = ctypes.c_void_p, [ctypes.c_void_p, *args]
    base.ggml_build_forward_expand.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    base.ggml_get_data.restype, base.ggml_get_data.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
    base.ggml_free.argtypes = [ctypes.c_void_p]
    cpu.ggml_graph_compute_with_ctx.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    return base, cpu


def _computed(op, *inputs: np.ndarray) -> np.ndarray:
    """op(base, ctx, *tensors) -> the ggml tensor to compute, over `inputs` (float32 or int32, each
    copied into a tensor of its shape, axes reversed as ggml counts them); its float32 result, of the
    first input's shape, computed on one thread of the CPU backend."""
    base, cpu = _graph_api()
    ctx = base.ggml_init(InitParams(64 << 20, None, False))
    try:
        tensors = []
        for a in inputs:
            new = getattr(base, f"ggml_new_tensor_{a.ndim}d")
            t = new(ctx, GGML_TYPE_F32 if a.dtype == np.float32 else GGML_TYPE_I32, *reversed(a.shape))
            ctypes.memmove(base.ggml_get_data(t), np.ascontiguousarray(a).ctypes.data, a.nbytes)
            tensors.append(t)
        result = op(base, ctx, *tensors)
        graph = base.ggml_new_graph(ctx)
        base.ggml_build_forward_expand(graph, result)
        cpu.ggml_graph_compute_with_ctx(ctx, graph, 1)
        return np.ctypeslib.as_array(ctypes.cast(base.ggml_get_data(result), ctypes.POINTER(ctypes.c_float)),
                                     shape=inputs[0].shape).copy()
    finally:
        base.ggml_free(ctx)


def rope_cos_sin(dim: int, freq_base: float, n_pos: int) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [n_pos, dim / 2] float32 of ggml's rope (ggml_rope_ext, pairs side by side, no
    scaling) at positions 0 .. n_pos - 1: the rotation of (1, 0) in every pair."""
    ones = np.zeros((n_pos, 1, dim), np.float32)
    ones[..., 0::2] = 1
    out = _computed(lambda base, ctx, x, pos: base.ggml_rope_ext(ctx, x, pos, None, dim, 0, 0, freq_base, 1.0, 0.0,
                                                                  1.0, 0.0, 0.0),
                    ones, np.arange(n_pos, dtype=np.int32)).reshape(n_pos, dim)
    return out[:, 0::2], out[:, 1::2]


def rms_norm(x: np.ndarray, eps: float) -> np.ndarray:
    """float32 rows [n, k] normed as ggml's rms_norm computes it (ggml_rms_norm, no weight)."""
    return _computed(lambda base, ctx, t: base.ggml_rms_norm(ctx, t, eps), x.astype(np.float32))
