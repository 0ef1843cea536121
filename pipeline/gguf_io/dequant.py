"""GGML block formats -> float32 torch tensors, computed on the target device.

Each function takes blocks as uint8 of shape (n_blocks, type_size) and returns float32 of
shape (n_blocks, block_size), with the same float operations in the same order as gguf-py's
numpy dequantizers, so the results are bit-identical to `gguf.quants.dequantize`; the types
gguf-py has no dequantizer for (Q1_0, Q2_0) follow ggml's dequantize_row_* the same way.
"""
import functools
import mmap
import threading
import time

import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from gguf import quants

from ..errors import UserError
from .ggml_types import Q1_0, Q2_0, QUANT_SIZES, GGMLType

QK_K = 256


@functools.cache
def _const(values: tuple, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A small constant tensor, made once per device: on a GPU making one per piece is a
    synchronous host-to-device copy each time."""
    return torch.tensor(values, dtype=dtype, device=device)


def _f16(b: torch.Tensor) -> torch.Tensor:
    # (n, 2) uint8 -> (n, 1) float32
    return b.contiguous().view(torch.float16).to(torch.float32)


def _nibbles(qs: torch.Tensor, group: int) -> torch.Tensor:
    # (n, k) uint8 -> (n, k/group, 2, group): low nibbles of each group, then high nibbles
    n = qs.shape[0]
    shifts = _const((0, 4), torch.uint8, qs.device).view(1, 1, 2, 1)
    return (qs.reshape(n, -1, 1, group) >> shifts) & 0x0F


def _bits(b: torch.Tensor, width: int, count: int) -> torch.Tensor:
    # (n, k) uint8 -> (n, k, count): successive `width`-bit fields of each byte, low first
    shifts = _const(tuple(range(0, width * count, width)), torch.uint8, b.device)
    return (b.unsqueeze(-1) >> shifts) & ((1 << width) - 1)


def q4_0(b):
    n = b.shape[0]
    d, qs = _f16(b[:, :2]), b[:, 2:]
    q = _nibbles(qs, 16).reshape(n, -1).to(torch.int8) - 8
    return d * q.to(torch.float32)


def q4_1(b):
    n = b.shape[0]
    d, m, qs = _f16(b[:, :2]), _f16(b[:, 2:4]), b[:, 4:]
    q = _nibbles(qs, 16).reshape(n, -1).to(torch.float32)
    return d * q + m


def _q5_quants(qh: torch.Tensor, qs: torch.Tensor) -> torch.Tensor:
    # qh (n, 4) little-endian uint32 of high bits, qs (n, 16) -> (n, 32) uint8 in [0, 32)
    n = qs.shape[0]
    high = _bits(qh, 1, 8).reshape(n, 32)
    low = _nibbles(qs, 16).reshape(n, 32)
    return low | (high << 4)


def q5_0(b):
    d = _f16(b[:, :2])
    q = _q5_quants(b[:, 2:6], b[:, 6:]).to(torch.int8) - 16
    return d * q.to(torch.float32)


def q5_1(b):
    d, m = _f16(b[:, :2]), _f16(b[:, 2:4])
    q = _q5_quants(b[:, 4:8], b[:, 8:]).to(torch.float32)
    return d * q + m


def q8_0(b):
    d, x = _f16(b[:, :2]), b[:, 2:].contiguous().view(torch.int8).to(torch.float32)
    return x * d


def q2_k(b):
    n = b.shape[0]
    scales, qs = b[:, :16], b[:, 16:80]
    d, dmin = _f16(b[:, 80:82]), _f16(b[:, 82:84])
    dl = (d * (scales & 0xF).to(torch.float32)).reshape(n, 16, 1)
    ml = (dmin * (scales >> 4).to(torch.float32)).reshape(n, 16, 1)
    # (n, 2, 32) -> (n, 2, 4, 32): 2-bit fields, each shift a run of 32 values
    q = (qs.reshape(n, 2, 1, 32) >> _shifts(b, [0, 2, 4, 6])) & 3
    q = q.reshape(n, 16, 16).to(torch.float32)
    return (dl * q - ml).reshape(n, QK_K)


def _shifts(like: torch.Tensor, values: list[int]) -> torch.Tensor:
    return _const(tuple(values), torch.uint8, like.device).view(1, 1, -1, 1)


def q3_k(b):
    n = b.shape[0]
    hmask, qs, scales, d = b[:, :32], b[:, 32:96], b[:, 96:108], _f16(b[:, 108:110])
    lscales = (scales[:, :8].reshape(n, 1, 8) >> _shifts(b, [0, 4]).view(1, 2, 1)).reshape(n, 16)
    hscales = (scales[:, 8:].reshape(n, 1, 4) >> _shifts(b, [0, 2, 4, 6]).view(1, 4, 1)).reshape(n, 16)
    sc = (lscales & 0x0F) | ((hscales & 0x03) << 4)
    sc = (sc.to(torch.int8) - 32).to(torch.float32)
    dl = (d * sc).reshape(n, 16, 1)
    ql = (qs.reshape(n, 2, 1, 32) >> _shifts(b, [0, 2, 4, 6])).reshape(n, 16, 16) & 3
    qh = (hmask.reshape(n, 1, 1, 32) >> _shifts(b, list(range(8)))).reshape(n, 16, 16) & 1
    qh = qh ^ 1  # the offset of 4 applies where the mask bit is clear
    q = (ql.to(torch.int8) - (qh << 2).to(torch.int8)).to(torch.float32)
    return (dl * q).reshape(n, QK_K)


def _k_scale_min(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # (n, 12) packed 6-bit scales and mins -> two (n, 8)
    n = scales.shape[0]
    s = scales.reshape(n, 3, 4)
    d, m, m_d = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc, mn


def _k_scaled(b):
    n = b.shape[0]
    d, dmin = _f16(b[:, :2]), _f16(b[:, 2:4])
    sc, mn = _k_scale_min(b[:, 4:16])
    d = (d * sc.to(torch.float32)).reshape(n, -1, 1)
    dm = (dmin * mn.to(torch.float32)).reshape(n, -1, 1)
    return d, dm


def q4_k(b):
    n = b.shape[0]
    d, dm = _k_scaled(b)
    q = _nibbles(b[:, 16:], 32).reshape(n, -1, 32).to(torch.float32)
    return (d * q - dm).reshape(n, QK_K)


def q5_k(b):
    n = b.shape[0]
    d, dm = _k_scaled(b)
    qh, qs = b[:, 16:48], b[:, 48:]
    ql = _nibbles(qs, 32).reshape(n, -1, 32)
    qh = ((qh.reshape(n, 1, 1, 32) >> _shifts(b, list(range(8)))) & 1).reshape(n, -1, 32)
    q = (ql | (qh << 4)).to(torch.float32)
    return (d * q - dm).reshape(n, QK_K)


def q6_k(b):
    n = b.shape[0]
    ql, qh, scales, d = b[:, :128], b[:, 128:192], b[:, 192:208], _f16(b[:, 208:210])
    d = (d * scales.contiguous().view(torch.int8).to(torch.float32)).reshape(n, 16, 1)
    low = _nibbles(ql, 64).reshape(n, -1, 32)
    high = ((qh.reshape(n, 2, 1, 32) >> _shifts(b, [0, 2, 4, 6])) & 3).reshape(n, -1, 32)
    q = (low | (high << 4)).to(torch.int8) - 32
    q = q.reshape(n, 16, -1).to(torch.float32)
    return (d * q).reshape(n, QK_K)


# non-linear 4-bit grids: the values an index stands for (IQ4_NL's, and e2m1 doubled for MXFP4)
IQ4_VALUES = torch.tensor(quants.IQ4_NL.kvalues, dtype=torch.float32)
MXFP4_VALUES = torch.tensor(quants.MXFP4.kvalues, dtype=torch.float32)


def _lookup(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return _placed(values, index.device)[index.long()]


@functools.cache
def _placed(table: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A module-level table (a grid, a value list) copied to `device` once."""
    return table.to(device)


def iq4_nl(b):
    n = b.shape[0]
    d, qs = b.split([2, 16], dim=1)
    return _f16(d) * _lookup(IQ4_VALUES, _nibbles(qs, 16).reshape(n, -1))


def iq4_xs(b):
    n = b.shape[0]
    d, scales_h, scales_l, qs = b.split([2, 2, QK_K // 64, QK_K // 2], dim=1)
    high = scales_h[:, 0].to(torch.int32) | (scales_h[:, 1].to(torch.int32) << 8)          # little-endian uint16
    high = (high[:, None] >> _const(tuple(range(0, QK_K // 16, 2)), torch.int32, b.device)) & 0x03
    low = ((scales_l.unsqueeze(-1) >> _shifts(b, [0, 4]).view(1, 1, 2)) & 0x0F).reshape(n, -1)     # byte by byte
    scales = (low.to(torch.int32) | (high << 4)) - 32                                       # [n, 8] in [-32, 32)
    dl = (_f16(d) * scales.to(torch.float32)).reshape(n, -1, 1)
    q = _nibbles(qs, 16).reshape(n, -1, 32)
    return (dl * _lookup(IQ4_VALUES, q)).reshape(n, QK_K)


def mxfp4(b):
    n = b.shape[0]
    e, qs = b.split([1, 16], dim=1)
    e = e.to(torch.int32)
    # ggml_e8m0_to_fp32_half: 2^(e - 128) as float32 bits, subnormal below e = 2
    d = torch.where(e < 2, 0x00200000 << e, (e - 1) << 23).view(torch.float32)
    return d * _lookup(MXFP4_VALUES, _nibbles(qs, 16).reshape(n, -1))


def nvfp4(b):
    n = b.shape[0]
    scale_bytes, qs = b.split([4, 32], dim=1)                            # four 16-value groups
    x = scale_bytes.to(torch.int32)
    # unsigned E4M3 (bias 7), halved for the doubled e2m1 values; 0 and 0x7F (NaN) give 0
    exp, man = (x >> 3) & 0x0F, (x & 0x07).to(torch.float32)
    value = torch.where(exp == 0, man * 2.0 ** -9, (1.0 + man / 8.0) * torch.exp2((exp - 7).to(torch.float32)))
    d = torch.where((x == 0) | (x == 0x7F), 0.0, value * 0.5).view(n, 4, 1)
    q = qs.reshape(n, 4, 8)
    return (d * _lookup(MXFP4_VALUES, torch.cat([q & 0x0F, q >> 4], dim=-1))).reshape(n, 64)


def tq1_0(b):
    n = b.shape[0]
    qs, qh, d = b.split([(QK_K - 4 * QK_K // 64) // 5, QK_K // 64, 2], dim=1)
    pow3 = _const((1, 3, 9, 27, 81), torch.uint8, b.device)
    # each byte holds 5 (4 in qh) base-3 digits as a fixed-point fraction: multiplying by 3^k
    # (modulo 256) brings digit k to the top, (x * 3) >> 8 reads it
    digits = torch.cat([(qs[:, :32].reshape(n, 1, 1, 32) * pow3.view(1, 1, 5, 1)).reshape(n, -1),
                        (qs[:, 32:].reshape(n, 1, 1, 16) * pow3.view(1, 1, 5, 1)).reshape(n, -1),
                        (qh.reshape(n, 1, 1, 4) * pow3[:4].view(1, 1, 4, 1)).reshape(n, -1)], dim=-1)
    q = ((digits.to(torch.int32) * 3) >> 8) - 1
    return _f16(d) * q.to(torch.float32)


def tq2_0(b):
    n = b.shape[0]
    qs, d = b.split([QK_K // 4, 2], dim=1)
    q = ((qs.reshape(n, -1, 1, 32) >> _shifts(b, [0, 2, 4, 6])) & 0x03).reshape(n, -1).to(torch.int32) - 1
    return _f16(d) * q.to(torch.float32)


def _f16_as_ggml(b: torch.Tensor) -> torch.Tensor:
    """(n, 2) uint8 little-endian float16 -> (n, 1) float32 as ggml_compute_fp16_to_fp32 makes
    it: exact, and a NaN quieted with its sign and payload kept (torch's conversion gives every
    NaN one pattern). Integer operations but for the subnormals' exact product: the same bits
    on every device."""
    h = b[:, :1].to(torch.int32) | (b[:, 1:2].to(torch.int32) << 8)
    exp, man = (h >> 10) & 0x1F, h & 0x3FF
    special = 0x7F800000 | (man << 13) | ((man != 0).to(torch.int32) << 22)   # infinity, quiet NaN
    normal = ((h & 0x7FFF) << 13) + ((127 - 15) << 23)                         # exponent rebiased
    bits = torch.where(exp == 0x1F, special, normal)
    mag = torch.where(exp == 0, man.to(torch.float32) * 2.0 ** -24, bits.view(torch.float32))
    return torch.where((h >> 15) == 1, -mag, mag)


QK1_0, QK2_0 = QUANT_SIZES[Q1_0][0], QUANT_SIZES[Q2_0][0]


def q1_0(b):
    n = b.shape[0]
    d, qs = b.split([2, QK1_0 // 8], dim=1)
    d = _f16_as_ggml(d)                                                 # [n, 1]
    set_ = _bits(qs, 1, 8).reshape(n, QK1_0) == 1                       # value j: bit j % 8 of byte j // 8
    return torch.where(set_, d, -d)


def q2_0(b):
    n = b.shape[0]
    d, qs = b.split([2, QK2_0 // 4], dim=1)
    q = _bits(qs, 2, 4).reshape(n, QK2_0).to(torch.int32) - 1           # value j: field j % 4 of byte j // 4
    return q.to(torch.float32) * _f16_as_ggml(d)


def _grid(cls) -> torch.Tensor:
    """gguf-py's value grid of an IQ type, [entries, 8 or 4] float32."""
    if cls.grid is None:
        cls.init_grid()
    return torch.from_numpy(np.ascontiguousarray(cls.grid.reshape(cls.grid_shape)))


KSIGNS = torch.tensor(list(quants.IQ2_XXS.ksigns), dtype=torch.uint8)   # 7 sign bits -> 8 with even parity
GRIDS = {qtype: _grid(cls) for qtype, cls in ((Q.IQ2_XXS, quants.IQ2_XXS), (Q.IQ2_XS, quants.IQ2_XS),
                                              (Q.IQ2_S, quants.IQ2_S), (Q.IQ3_XXS, quants.IQ3_XXS),
                                              (Q.IQ3_S, quants.IQ3_S), (Q.IQ1_S, quants.IQ1_S))}
IQ1_DELTA = float(quants.IQ1_S.delta)


def _u16(b: torch.Tensor) -> torch.Tensor:
    # (n, 2k) uint8 -> (n, k) little-endian uint16 values as int64
    return b.contiguous().view(torch.int16).to(torch.int64) & 0xFFFF


def _u32(b: torch.Tensor) -> torch.Tensor:
    # (n, 4k) uint8 -> (n, k) little-endian uint32 values as int64
    return b.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def _byte_nibbles(b: torch.Tensor) -> torch.Tensor:
    # (n, k) uint8 -> (n, 2k): low then high nibble of each byte in turn
    return ((b.unsqueeze(-1) >> _shifts(b, [0, 4]).view(1, 1, 2)) & 0x0F).reshape(b.shape[0], -1)


def _fields(x: torch.Tensor, shifts: list[int], mask: int) -> torch.Tensor:
    # (n, k) integers -> (n, k * len(shifts)): the fields at `shifts` of each value in turn
    return ((x.unsqueeze(-1) >> _const(tuple(shifts), x.dtype, x.device)) & mask).reshape(x.shape[0], -1)


def _signs(bits: torch.Tensor) -> torch.Tensor:
    # (...) uint8 of 8 sign bits -> (..., 8) float32 +1 / -1
    set_ = (bits.unsqueeze(-1) >> _const(tuple(range(8)), torch.uint8, bits.device)) & 1
    return 1.0 - 2.0 * set_.to(torch.float32)


def iq2_xxs(b):
    n = b.shape[0]
    d, qs = b.split([2, QK_K // 4], dim=1)
    aux = _u32(qs).view(n, -1, 2)                                       # [n, 8, 2]: grid bytes, signs + scale
    db = (_f16(d) * (0.5 + (aux[..., 1] >> 28).to(torch.float32)) * 0.25).view(n, -1, 1, 1)
    signs = _signs(_lookup(KSIGNS, _fields(aux[..., 1], [0, 7, 14, 21], 0x7F)).view(n, -1, 4))   # [n, 8, 4, 8]
    grid = _lookup(GRIDS[Q.IQ2_XXS], qs.reshape(n, -1, 2, 4)[:, :, 0])                    # [n, 8, 4, 8]
    return (db * grid * signs).reshape(n, QK_K)


def iq2_xs(b):
    n = b.shape[0]
    d, qs, scales = b.split([2, QK_K // 4, QK_K // 32], dim=1)
    q = _u16(qs)                                                        # [n, 32]: grid index | signs << 9
    db = (_f16(d) * (0.5 + _byte_nibbles(scales).to(torch.float32)) * 0.25).view(n, -1, 1, 1)
    signs = _signs(_lookup(KSIGNS, q >> 9)).view(n, -1, 2, 8)
    grid = _lookup(GRIDS[Q.IQ2_XS], q & 511).view(n, -1, 2, 8)
    return (db * grid * signs).reshape(n, QK_K)


def iq2_s(b):
    n = b.shape[0]
    d, qs, sign_bits, qh, scales = b.split([2, QK_K // 8, QK_K // 8, QK_K // 32, QK_K // 32], dim=1)
    db = (_f16(d) * (0.5 + _byte_nibbles(scales).to(torch.float32)) * 0.25).view(n, -1, 1, 1)
    signs = _signs(sign_bits).view(n, -1, 2, 8)
    index = qs.to(torch.int64) | (_fields(qh.to(torch.int64), [0, 2, 4, 6], 0x03) << 8)
    grid = _lookup(GRIDS[Q.IQ2_S], index).view(n, -1, 2, 8)
    return (db * grid * signs).reshape(n, QK_K)


def iq3_xxs(b):
    n = b.shape[0]
    d, qs, scales = b.split([2, QK_K // 4, QK_K // 8], dim=1)
    aux = _u32(scales)                                                  # [n, 8]: signs + scale
    db = (_f16(d) * (0.5 + (aux >> 28).to(torch.float32)) * 0.5).view(n, -1, 1, 1)
    signs = _signs(_lookup(KSIGNS, _fields(aux, [0, 7, 14, 21], 0x7F)).view(n, -1, 4))
    grid = _lookup(GRIDS[Q.IQ3_XXS], qs).view(n, -1, 4, 8)
    return (db * grid * signs).reshape(n, QK_K)


def iq3_s(b):
    n = b.shape[0]
    d, qs, qh, sign_bits, scales = b.split([2, QK_K // 4, QK_K // 32, QK_K // 8, QK_K // 64], dim=1)
    db = (_f16(d) * (1 + 2 * _byte_nibbles(scales)).to(torch.float32)).view(n, -1, 1, 1)
    signs = _signs(sign_bits).view(n, -1, 4, 8)
    index = qs.to(torch.int64) | (_fields(qh.to(torch.int64), list(range(8)), 0x01) << 8)
    grid = _lookup(GRIDS[Q.IQ3_S], index).view(n, -1, 4, 8)
    return (db * grid * signs).reshape(n, QK_K)


def iq1_s(b):
    n = b.shape[0]
    d, qs, qh = b.split([2, QK_K // 8, QK_K // 16], dim=1)
    h = _u16(qh)                                                        # [n, 8]
    dl = (_f16(d) * (2 * ((h >> 12) & 7) + 1).to(torch.float32)).view(n, -1, 1, 1)
    delta = torch.where((h & 0x8000) == 0, IQ1_DELTA, -IQ1_DELTA).to(torch.float32).view(n, -1, 1, 1)
    index = qs.to(torch.int64) | (_fields(h, [0, 3, 6, 9], 0x07) << 8)
    grid = _lookup(GRIDS[Q.IQ1_S], index).view(n, -1, 4, 8)
    return (dl * (grid + delta)).reshape(n, QK_K)


def iq1_m(b):
    """As ggml's dequantize_row_iq1_m (and gguf-py's: its `qh & 0x08 == 0` is `(qh & 0x08) == 0`
    in Python, where `&` binds tighter than `==`): a group's delta is -delta where its sign bit is set."""
    n = b.shape[0]
    qs, qh, scales = b.split([QK_K // 8, QK_K // 16, QK_K // 32], dim=1)
    sc = _u16(scales)                                                   # [n, 4]; the fp16 scale in their top nibbles
    top = (sc & 0xF000) >> _const((12, 8, 4, 0), torch.int64, b.device)
    d = (top[:, 0] | top[:, 1] | top[:, 2] | top[:, 3]).to(torch.int16).view(torch.float16).to(torch.float32)
    dl = (d.view(n, 1) * (2 * _fields(sc, [0, 3, 6, 9], 0x07) + 1).to(torch.float32)).view(n, -1, 2, 1, 1)
    halves = _byte_nibbles(qh)                                          # [n, 32]: 3 index bits + the delta sign
    index = qs.to(torch.int64) | ((halves & 0x07).to(torch.int64) << 8)
    delta = torch.where((halves & 0x08) == 0, IQ1_DELTA, -IQ1_DELTA).to(torch.float32).view(n, -1, 2, 2, 1)
    grid = _lookup(GRIDS[Q.IQ1_S], index).view(n, -1, 2, 2, 8)
    return (dl * (grid + delta)).reshape(n, QK_K)


def f32(b):
    return b.contiguous().view(torch.float32).clone()


def f16(b):
    return b.contiguous().view(torch.float16).to(torch.float32)


def bf16(b):
    return b.contiguous().view(torch.bfloat16).to(torch.float32)   # exact, NaN payloads included


# float types whose bytes are the values a computation in that dtype takes: copied as they are
STORED_AS = {Q.F32: torch.float32, Q.F16: torch.float16, Q.BF16: torch.bfloat16, Q.I32: torch.int32}

BLOCK_DEQUANTIZERS = {
    Q.F32: f32, Q.F16: f16, Q.BF16: bf16,
    Q.Q4_0: q4_0, Q.Q4_1: q4_1, Q.Q5_0: q5_0, Q.Q5_1: q5_1, Q.Q8_0: q8_0,
    Q.Q2_K: q2_k, Q.Q3_K: q3_k, Q.Q4_K: q4_k, Q.Q5_K: q5_k, Q.Q6_K: q6_k,
    Q.IQ4_NL: iq4_nl, Q.IQ4_XS: iq4_xs, Q.MXFP4: mxfp4, Q.TQ1_0: tq1_0, Q.TQ2_0: tq2_0,
    Q.IQ2_XXS: iq2_xxs, Q.IQ2_XS: iq2_xs, Q.IQ2_S: iq2_s, Q.IQ3_XXS: iq3_xxs, Q.IQ3_S: iq3_s,
    Q.IQ1_S: iq1_s, Q.IQ1_M: iq1_m, Q.NVFP4: nvfp4, Q1_0: q1_0, Q2_0: q2_0,
}


# values dequantized per step: on the CPU the intermediates of a step stay in cache instead of
# making several passes over (and page-faulting) tensors the size of the weight; a GPU takes
# bigger steps, each an asynchronous copy out of pinned memory
PIECE_VALUES = 1 << 19
GPU_PIECE_VALUES = 1 << 22


DEQUANTIZING = threading.RLock()
FILE_BYTES_READ = [0]   # bytes of the file dequantized by this process: what a task reads of its weights
READ_WAIT_S = [0.0]     # seconds spent faulting those bytes in from the file, apart from dequantizing them

# the compiled host loops cost a process about 0.5 s to start (importing numba, its threads, its
# cached code), what the torch operations lose on about 100 MB of file bytes: measured whole-trunk
# loads, Qwen2.5-0.5B's 236 MB took 0.7 s with the loops against 1.0-1.5 s without, SmolLM2's 80 MB
# 0.5 s against 0.3 s; so a pass over less keeps the torch operations
COMPILED_LOOPS_FROM_BYTES = 128 << 20
COMPILED_LOOPS = [False]   # started in this process


def plan_host_load(file_bytes: int) -> None:
    """A pass is about to dequantize `file_bytes` of weights on the host: start the compiled
    loops where they pay for their start (once started, every later tensor takes them)."""
    if file_bytes >= COMPILED_LOOPS_FROM_BYTES:
        COMPILED_LOOPS[0] = True


def dequantize(raw: np.ndarray, qtype: GGMLType, device: torch.device | str = "cpu", name: str = "",
               dtype: torch.dtype = torch.float32, out: torch.Tensor | None = None) -> torch.Tensor:
    """uint8 (..., row_bytes) in GGML `qtype` -> `dtype` (..., row_length) on `device`: the
    float32 values cast to `dtype`, piece by piece; into `out` where it is given (a contiguous
    tensor of that shape, dtype and device). A type without a torch dequantizer goes through
    gguf-py's numpy one on the host, in the same pieces, so no copy of the whole tensor is made.
    One tensor at a time in a process (a window's layers load in a thread beside its computation,
    which may dequantize too): the staging buffers and the compiled loops' threads are shared."""
    with DEQUANTIZING:
        return _dequantize(raw, qtype, device, name, dtype, out)


def _dequantize(raw: np.ndarray, qtype: GGMLType, device, name: str, dtype: torch.dtype,
                out: torch.Tensor | None) -> torch.Tensor:
    block, type_size = QUANT_SIZES[qtype]
    out_shape = (*raw.shape[:-1], raw.shape[-1] // type_size * block)
    FILE_BYTES_READ[0] += raw.nbytes
    started = time.perf_counter()
    if raw.flags.c_contiguous and raw.size:   # one byte of every page read: the disk's part of the load
        raw.reshape(-1)[::mmap.PAGESIZE].max()
    READ_WAIT_S[0] += time.perf_counter() - started
    if out is None:
        out = torch.empty(out_shape, dtype=dtype, device=device)
    fn, where = BLOCK_DEQUANTIZERS.get(qtype), torch.device(device)
    if STORED_AS.get(qtype) == dtype:   # the bytes themselves, without a round trip through float32
        if where.type == "cpu":            # one copy, from the file's pages into `out`
            out.view(torch.uint8).numpy().reshape(raw.shape)[...] = raw
            return out
        fn = functools.partial(_as_stored, dtype=dtype)
    elif where.type == "cpu" and COMPILED_LOOPS[0] and _compiled_loops().handles(qtype, dtype):   # one pass
        _compiled_loops().dequantize_into(raw.reshape(-1, type_size), qtype, out)
        return out
    elif fn is None:
        fn, where = _with_gguf_py(qtype, name), torch.device("cpu")
    blocks = raw.reshape(-1, type_size)                                  # [n_blocks, type_size]
    flat = out.view(blocks.shape[0], block)                              # [n_blocks, block]
    values = PIECE_VALUES if where.type == "cpu" else GPU_PIECE_VALUES
    for start, piece in Uploads(where).pieces(blocks, max(values // block, 1)):
        flat[start:start + piece.shape[0]] = fn(piece)
    return out


def _compiled_loops():
    from . import host_dequant  # numba, imported by the processes that start the loops only

    return host_dequant


def _as_stored(b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return b.contiguous().view(dtype)


class Uploads:
    """The bytes of successive pieces of a tensor, as uint8 tensors on `device`, through
    staging buffers kept for the process: on the CPU one buffer, refilled for each piece
    (copying out of the read-only file map also makes the bytes contiguous and writable);
    on a GPU two pinned ones taking turns, each piece's copy asynchronous, so the host fills
    one buffer while the other's copy and the dequantization run on the device. The event
    after a buffer's last copy lives as long as the buffer: the next piece written into it,
    of this tensor or of the next one asked for, waits until that copy has left it."""
    _staging: dict[tuple[str, int], torch.Tensor] = {}
    _copied: dict[tuple[str, int], object] = {}   # per buffer: the event after its last copy

    def __init__(self, device: torch.device):
        self.device, self.gpu = device, device.type != "cpu"

    def buffer(self, k: int, nbytes: int) -> torch.Tensor:
        """Buffer k, free to be written: its last copy, of any call, has completed."""
        key = (str(self.device), k)
        copied = self._copied.pop(key, None)
        if copied is not None:
            copied.synchronize()
        buf = self._staging.get(key)
        if buf is None or buf.numel() < nbytes:
            buf = self._staging[key] = self.staging(nbytes)
        return buf

    def staging(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.gpu)

    def upload(self, buf: torch.Tensor) -> tuple[torch.Tensor, object]:
        """(the bytes on the device, the event after their copy) of a filled staging buffer."""
        piece = buf.to(self.device, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record()
        return piece, copied

    def pieces(self, blocks: np.ndarray, step: int):
        """(first block, piece [<= step, type_size] uint8 on the device) for blocks [n, type_size];
        a piece is valid until the next one but one is asked for."""
        n, width = blocks.shape
        for k, start in enumerate(range(0, n, step)):
            rows, turn = min(step, n - start), k % 2 if self.gpu else 0
            buf = self.buffer(turn, rows * width)[:rows * width].view(rows, width)
            buf.numpy()[...] = blocks[start:start + rows]
            if not self.gpu:
                yield start, buf
                continue
            piece, self._copied[(str(self.device), turn)] = self.upload(buf)
            yield start, piece


def _with_gguf_py(qtype: GGMLType, name: str):
    """gguf-py's numpy dequantizer of `qtype` as a block function: (n, type_size) uint8 on the
    host -> (n, block) float32."""
    def fn(piece: torch.Tensor) -> torch.Tensor:
        try:
            return torch.from_numpy(quants.dequantize(piece.numpy(), qtype))
        except NotImplementedError:
            raise UserError(f"tensor {name or '?'} has GGML type {qtype.name}, which is not supported") from None
    return fn
