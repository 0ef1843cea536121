"""GGML block formats -> float32 or bfloat16 on the host, one compiled loop per format.

The torch dequantizers in `dequant.py` make a pass over memory per operation; on the CPU that
holds a window's load to a few hundred MB/s of file bytes. These loops read each block once and
write its values once, in the dtype the window computes in, over the threads torch is given.
Each takes blocks as uint8 (n_blocks, type_size) and writes (n_blocks, block_size) values: the
same float32 operations in the same order as gguf-py's numpy dequantizers (so the float32
values are bit-identical to `gguf.quants.dequantize`; Q1_0's and Q2_0's to ggml's
dequantize_row_*), and into bfloat16 the float32 value rounded to nearest even as torch rounds it.
"""
import threading

import numba
import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from gguf import quants
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic, overload

from .ggml_types import Q1_0, Q2_0, QUANT_SIZES, GGMLType

F32 = np.float32
IQ4_VALUES = np.asarray(quants.IQ4_NL.kvalues, dtype=np.float32)
MXFP4_VALUES = np.asarray(quants.MXFP4.kvalues, dtype=np.float32)


@intrinsic
def _as_float32(typingctx, bits):
    """The float32 whose bits are the low 32 of an integer."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        word = args[0]
        if bits.bitwidth > 32:
            word = builder.trunc(word, ir.IntType(32))
        return builder.bitcast(word, ir.FloatType())
    return types.float32(bits), codegen


@intrinsic
def _bits_of(typingctx, value):
    """The bits of a float32, as a non-negative int64."""
    if value != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.zext(builder.bitcast(args[0], ir.IntType(32)), ir.IntType(64))
    return types.int64(value), codegen


@njit(inline="always")
def _half(b, i, at):
    """The little-endian float16 at byte `at` of block i, as float32 as ggml_compute_fp16_to_fp32
    makes it (exact; a NaN quieted, its sign and payload kept)."""
    h = np.int64(b[i, at]) | (np.int64(b[i, at + 1]) << 8)
    sign, exp, man = (h & 0x8000) << 16, (h >> 10) & 0x1F, h & 0x3FF
    if exp == 0x1F:
        quiet = 0x400000 if man else 0
        return _as_float32(sign | 0x7F800000 | quiet | (man << 13))
    if exp != 0:
        return _as_float32(sign | ((exp + 112) << 23) | (man << 13))
    tiny = F32(man) * F32(2.0 ** -24)                         # zero or subnormal: exact in float32
    return -tiny if sign else tiny


def _store(out, i, j, value):
    """out[i, j] = value: the float32 itself, or its bfloat16 bits."""


@overload(_store, inline="always")
def _store_typed(out, i, j, value):
    if out.dtype == types.float32:
        def store(out, i, j, value):
            out[i, j] = value
    else:
        def store(out, i, j, value):                          # torch's float32 -> bfloat16
            if value != value:
                out[i, j] = 0x7FC0
            else:
                bits = _bits_of(value)
                out[i, j] = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return store


KERNEL = dict(parallel=True, cache=True, boundscheck=False, nogil=True)


@njit(**KERNEL)
def q4_0(b, out):
    for i in prange(b.shape[0]):
        d = _half(b, i, 0)
        for k in range(16):
            q = b[i, 2 + k]
            _store(out, i, k, d * F32(np.int32(q & 0x0F) - 8))
            _store(out, i, 16 + k, d * F32(np.int32(q >> 4) - 8))


@njit(**KERNEL)
def q4_1(b, out):
    for i in prange(b.shape[0]):
        d, m = _half(b, i, 0), _half(b, i, 2)
        for k in range(16):
            q = b[i, 4 + k]
            _store(out, i, k, d * F32(q & 0x0F) + m)
            _store(out, i, 16 + k, d * F32(q >> 4) + m)


@njit(inline="always")
def _high_bits(b, i, at):
    # the little-endian uint32 at byte `at` of block i: bit p is the fifth bit of quant p
    return (np.int64(b[i, at]) | (np.int64(b[i, at + 1]) << 8) | (np.int64(b[i, at + 2]) << 16)
            | (np.int64(b[i, at + 3]) << 24))


@njit(**KERNEL)
def q5_0(b, out):
    for i in prange(b.shape[0]):
        d, qh = _half(b, i, 0), _high_bits(b, i, 2)
        for k in range(16):
            q = np.int64(b[i, 6 + k])
            _store(out, i, k, d * F32(((q & 0x0F) | (((qh >> k) & 1) << 4)) - 16))
            _store(out, i, 16 + k, d * F32(((q >> 4) | (((qh >> (k + 16)) & 1) << 4)) - 16))


@njit(**KERNEL)
def q5_1(b, out):
    for i in prange(b.shape[0]):
        d, m, qh = _half(b, i, 0), _half(b, i, 2), _high_bits(b, i, 4)
        for k in range(16):
            q = np.int64(b[i, 8 + k])
            _store(out, i, k, d * F32((q & 0x0F) | (((qh >> k) & 1) << 4)) + m)
            _store(out, i, 16 + k, d * F32((q >> 4) | (((qh >> (k + 16)) & 1) << 4)) + m)


@njit(**KERNEL)
def q8_0(b, out):
    for i in prange(b.shape[0]):
        d = _half(b, i, 0)
        for p in range(32):
            _store(out, i, p, F32(np.int8(b[i, 2 + p])) * d)


@njit(**KERNEL)
def q2_k(b, out):
    for i in prange(b.shape[0]):
        d, dmin = _half(b, i, 80), _half(b, i, 82)
        for g in range(16):                                   # 16 groups of 16, a scale and a min each
            dl, ml = d * F32(b[i, g] & 0x0F), dmin * F32(b[i, g] >> 4)
            h, s = g >> 3, (g >> 1) & 3                       # value 16g + k = 128h + 32s + (16(g & 1) + k)
            for k in range(16):
                q = (b[i, 16 + 32 * h + 16 * (g & 1) + k] >> (2 * s)) & 3
                _store(out, i, 16 * g + k, dl * F32(q) - ml)


@njit(**KERNEL)
def q3_k(b, out):
    for i in prange(b.shape[0]):
        d = _half(b, i, 108)
        for g in range(16):
            low = (b[i, 96 + (g & 7)] >> (4 * (g >> 3))) & 0x0F
            high = (b[i, 104 + (g & 3)] >> (2 * (g >> 2))) & 0x03
            dl = d * F32(np.int32(low | (high << 4)) - 32)
            h, s = g >> 3, (g >> 1) & 3
            for k in range(16):
                r = 16 * (g & 1) + k                          # value 128h + 32s + r
                ql = np.int32((b[i, 32 + 32 * h + r] >> (2 * s)) & 3)
                set_ = np.int32((b[i, r] >> (4 * h + s)) & 1)  # the high bit; clear means -4
                _store(out, i, 16 * g + k, dl * F32(ql - 4 * (1 - set_)))


@njit(inline="always")
def _k_scale_min(b, i, j):
    # the 6-bit scale and min of group j of 8, packed in bytes 4..15
    if j < 4:
        return b[i, 4 + j] & 0x3F, b[i, 8 + j] & 0x3F
    sc = (b[i, 8 + j] & 0x0F) | ((b[i, j] >> 2) & 0x30)
    mn = (b[i, 8 + j] >> 4) | ((b[i, 4 + j] >> 2) & 0x30)
    return sc, mn


@njit(**KERNEL)
def q4_k(b, out):
    for i in prange(b.shape[0]):
        d, dmin = _half(b, i, 0), _half(b, i, 2)
        for j in range(8):                                    # 8 groups of 32: low nibbles, then high
            sc, mn = _k_scale_min(b, i, j)
            dl, ml = d * F32(sc), dmin * F32(mn)
            base, shift = 16 + 32 * (j >> 1), 4 * (j & 1)
            for k in range(32):
                _store(out, i, 32 * j + k, dl * F32((b[i, base + k] >> shift) & 0x0F) - ml)


@njit(**KERNEL)
def q5_k(b, out):
    for i in prange(b.shape[0]):
        d, dmin = _half(b, i, 0), _half(b, i, 2)
        for j in range(8):
            sc, mn = _k_scale_min(b, i, j)
            dl, ml = d * F32(sc), dmin * F32(mn)
            base, shift = 48 + 32 * (j >> 1), 4 * (j & 1)
            for k in range(32):
                q = ((b[i, base + k] >> shift) & 0x0F) | (((b[i, 16 + k] >> j) & 1) << 4)
                _store(out, i, 32 * j + k, dl * F32(q) - ml)


@njit(**KERNEL)
def q6_k(b, out):
    for i in prange(b.shape[0]):
        d = _half(b, i, 208)
        for g in range(16):
            dl = d * F32(np.int8(b[i, 192 + g]))
            h, r0 = g >> 3, 16 * (g & 7)                      # value 16g + k = 128h + r, r = r0 + k
            for k in range(16):
                r = r0 + k
                low = (b[i, 64 * h + (r & 63)] >> (4 * (r >> 6))) & 0x0F
                high = (b[i, 128 + 32 * h + (r & 31)] >> (2 * (r >> 5))) & 3
                _store(out, i, 16 * g + k, dl * F32(np.int32(low | (high << 4)) - 32))


@njit(**KERNEL)
def iq4_nl(b, out, values):
    for i in prange(b.shape[0]):
        d = _half(b, i, 0)
        for k in range(16):
            q = b[i, 2 + k]
            _store(out, i, k, d * values[q & 0x0F])
            _store(out, i, 16 + k, d * values[q >> 4])


@njit(**KERNEL)
def iq4_xs(b, out, values):
    for i in prange(b.shape[0]):
        d = _half(b, i, 0)
        high_bits = np.int32(b[i, 2]) | (np.int32(b[i, 3]) << 8)
        for j in range(8):                                    # 8 groups of 32, a 6-bit scale each
            low = (b[i, 4 + (j >> 1)] >> (4 * (j & 1))) & 0x0F
            dl = d * F32((np.int32(low) | (((high_bits >> (2 * j)) & 3) << 4)) - 32)
            for k in range(16):
                q = b[i, 8 + 16 * j + k]
                _store(out, i, 32 * j + k, dl * values[q & 0x0F])
                _store(out, i, 32 * j + 16 + k, dl * values[q >> 4])


@njit(**KERNEL)
def mxfp4(b, out, values):
    for i in prange(b.shape[0]):
        e = np.int64(b[i, 0])                                 # ggml_e8m0_to_fp32_half
        d = _as_float32(0x00200000 << e) if e < 2 else _as_float32((e - 1) << 23)
        for k in range(16):
            q = b[i, 1 + k]
            _store(out, i, k, d * values[q & 0x0F])
            _store(out, i, 16 + k, d * values[q >> 4])


@njit(inline="always")
def _negated(value):
    """-value with its sign bit flipped, a NaN's too (as C's unary minus)."""
    return _as_float32(_bits_of(value) ^ 0x80000000)


QK1_0, QK2_0 = QUANT_SIZES[Q1_0][0], QUANT_SIZES[Q2_0][0]


@njit(**KERNEL)
def q1_0(b, out):
    for i in prange(b.shape[0]):
        d = _half(b, i, 0)
        minus_d = _negated(d)
        for j in range(QK1_0):                                # value j: bit j % 8 of byte j // 8
            _store(out, i, j, d if (b[i, 2 + (j >> 3)] >> (j & 7)) & 1 else minus_d)


@njit(**KERNEL)
def q2_0(b, out):
    for i in prange(b.shape[0]):
        d = _half(b, i, 0)
        for j in range(QK2_0):                                # value j: field j % 4 of byte j // 4
            q = np.int32((b[i, 2 + (j >> 2)] >> (2 * (j & 3))) & 3)
            _store(out, i, j, F32(q - 1) * d)


# per format: its loop and the value table it reads, if any
KERNELS = {Q.Q4_0: (q4_0, None), Q.Q4_1: (q4_1, None), Q.Q5_0: (q5_0, None), Q.Q5_1: (q5_1, None),
           Q.Q8_0: (q8_0, None), Q.Q2_K: (q2_k, None), Q.Q3_K: (q3_k, None), Q.Q4_K: (q4_k, None),
           Q.Q5_K: (q5_k, None), Q.Q6_K: (q6_k, None), Q.IQ4_NL: (iq4_nl, IQ4_VALUES),
           Q.IQ4_XS: (iq4_xs, IQ4_VALUES), Q.MXFP4: (mxfp4, MXFP4_VALUES), Q1_0: (q1_0, None), Q2_0: (q2_0, None)}
DTYPES = {torch.float32: torch.float32, torch.bfloat16: torch.uint16}   # out dtype -> the view the loops write

_one_at_a_time = threading.Lock()   # numba's default thread pool runs one parallel loop at a time


def handles(qtype: GGMLType, dtype: torch.dtype) -> bool:
    return qtype in KERNELS and dtype in DTYPES


def dequantize_into(blocks: np.ndarray, qtype: GGMLType, out: torch.Tensor) -> None:
    """uint8 blocks (n, type_size) -> `out`, a contiguous CPU tensor of n * block values."""
    kernel, values = KERNELS[qtype]
    block, _ = QUANT_SIZES[qtype]
    target = out.view(DTYPES[out.dtype]).view(blocks.shape[0], block).numpy()   # [n, block]
    source = np.ascontiguousarray(blocks).view()
    source.flags.writeable = False            # one compiled loop for file maps and for copies alike
    with _one_at_a_time:
        numba.set_num_threads(max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)))
        if values is None:
            kernel(source, target)
        else:
            kernel(source, target, values)
