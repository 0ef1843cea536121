"""Activations as ggml's CPU products take them: a product of a quantized weight and a row of
float32 activations first quantizes the row to the weight type's `vec_dot_type` (Q8_0, Q8_1 or
Q8_K, block by block), then sums integer products; an F16 or BF16 weight takes the row rounded
to its own type. Quantizing a row as ggml's x86 code does and dequantizing it, then multiplying
in float32, gives ggml's products up to float reassociation.

The rounding follows ggml's x86 SIMD code, not its scalar reference: Q8_0 and Q8_1 scale a block
by 127 / amax in float32 and round half to even, the stored scale fp16(amax / 127); Q8_K
(256-value blocks) by -127 / x_max, x_max the block's first value of largest magnitude, rounded
half to even, its scale 1 / that in float32.
"""
import numpy as np
import torch
import torch.nn.functional as F

from .ggml_types import QUANT_SIZES, GGMLType

# ggml-cpu's type_traits_cpu: the type a weight type's dot product takes its activations in
VEC_DOT_TYPE = {
    **dict.fromkeys(("Q1_0", "Q2_0", "Q4_0", "Q5_0", "Q8_0", "MXFP4", "NVFP4", "IQ4_NL"), "Q8_0"),
    **dict.fromkeys(("Q4_1", "Q5_1"), "Q8_1"),
    **dict.fromkeys(("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ3_S", "IQ2_S",
                     "IQ1_S", "IQ1_M", "IQ4_XS", "TQ1_0", "TQ2_0"), "Q8_K"),
    "F16": "F16", "BF16": "BF16", "F32": "F32",
}


def vec_dot_type(qtype: GGMLType) -> str:
    """The type ggml quantizes (or rounds) activations to before a product with a weight of `qtype`."""
    return VEC_DOT_TYPE[qtype.name]


def _blocks(x: torch.Tensor, size: int) -> torch.Tensor:
    """x [..., K] float32 -> [..., K / size, size]"""
    if x.shape[-1] % size:
        raise ValueError(f"a row of {x.shape[-1]} values does not split into blocks of {size}")
    return x.float().unflatten(-1, (-1, size))


def _divided(numerator: float, d: torch.Tensor) -> torch.Tensor:
    """numerator / d, correctly rounded as C's float division (torch's scalar / tensor multiplies by
    the reciprocal); 0 where d is 0."""
    return torch.where(d != 0, torch.full_like(d, numerator) / d, 0.0)


def _rounded(x: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [..., K] -> (blocks' largest magnitude [..., nb, 1], 127 / it [..., nb, 1], the blocks
    scaled by that and rounded half to even [..., nb, size], float32)."""
    b = _blocks(x, size)
    amax = b.abs().amax(-1, keepdim=True)
    inverse = _divided(127.0, amax)
    return amax, inverse, (b * inverse).round_()


def q8_0(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., K] -> (scale [..., K/32] float16, quants [..., K/32, 32] int8), as ggml's x86
    quantize_row_q8_0."""
    amax, _, q = _rounded(x, 32)
    return (amax / 127.0).squeeze(-1).half(), q.to(torch.int8)


def q8_1(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [..., K] -> (scale [..., K/32] float16, quants [..., K/32, 32] int8, scaled sum
    [..., K/32] float16: fp16(scale_f32 x sum of the quants)), as ggml's x86 quantize_row_q8_1."""
    amax, _, q = _rounded(x, 32)
    d = (amax / 127.0).squeeze(-1)                                  # [..., nb] float32
    return d.half(), q.to(torch.int8), (d * q.sum(-1)).half()


def q8_k(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [..., K] -> (scale [..., K/256] float32, quants [..., K/256, 256] int8, sums of 16
    [..., K/256, 16] int16), as ggml's quantize_row_q8_K."""
    b = _blocks(x, 256)                                             # [..., nb, 256]
    top = b.gather(-1, b.abs().argmax(-1, keepdim=True))            # [..., nb, 1] the first of largest magnitude
    iscale = _divided(-127.0, top)
    q = torch.round(b * iscale).clamp_(max=127)
    d = _divided(1.0, iscale)
    return d.squeeze(-1), q.to(torch.int8), q.unflatten(-1, (16, 16)).sum(-1).to(torch.int16)


def product_input(x: torch.Tensor, dot_type: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(x [..., K] float32 as the dot product of `dot_type` sees it: quantized and dequantized,
    rounded to F16 or BF16, or (F32) as it is; for Q8_1, the rounding of its blocks' stored sums
    [..., K/32], fp16(d x sum q) - fp16(d) x sum q, else None). The values of q8_0, q8_1 and q8_k's
    blocks, computed in float32 alone: Q8_K's sign convention cancels in scale x quant."""
    if dot_type == "F32":
        return x, None
    if dot_type in ("F16", "BF16"):
        return x.to(torch.float16 if dot_type == "F16" else torch.bfloat16).float(), None
    amax, inverse, q = _rounded(x, 256 if dot_type == "Q8_K" else 32)   # [..., nb, 1] x 2, [..., nb, block]
    if dot_type == "Q8_K":
        return q.mul_(_divided(1.0, inverse)).flatten(-2), None
    d = amax / 127.0
    d16 = d.half().float()
    sum_error = None
    if dot_type == "Q8_1":
        sums = q.sum(-1, keepdim=True)                                # [..., nb, 1], exact
        sum_error = ((d * sums).half().float() - d16 * sums).squeeze(-1)
    return q.mul_(d16).flatten(-2), sum_error


def block_mins(raw: np.ndarray, qtype: GGMLType) -> torch.Tensor | None:
    """uint8 rows [..., row_bytes] of a Q4_1 or Q5_1 weight (the file's bytes) -> its blocks' minima
    [..., K/32] float32 (each block starts with its scale, then its minimum, as float16); None for
    other types."""
    if vec_dot_type(qtype) != "Q8_1":
        return None
    _, type_size = QUANT_SIZES[qtype]
    blocks = raw.reshape(*raw.shape[:-1], -1, type_size)                  # [..., K/32, type_size]
    return torch.from_numpy(np.ascontiguousarray(blocks[..., 2:4]).view(np.float16)[..., 0].astype(np.float32))


def product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dot_type: str,
            mins: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] @ weight [N, K].T (+ bias [N]) -> [..., N], as ggml's CPU product: x quantized
    for `dot_type`. A Q8_1 row's blocks carry their sum as fp16(scale x sum of the quants), which
    ggml multiplies by the weight's block minima (`mins` [N, K/32], block_mins); the dequantized
    product takes fp16(scale) x sum instead, so the difference is added through them."""
    return input_product(*product_input(x, dot_type), weight, bias, mins)


def input_product(values: torch.Tensor, sum_error: torch.Tensor | None, weight: torch.Tensor,
                  bias: torch.Tensor | None, mins: torch.Tensor | None) -> torch.Tensor:
    """product() of an input already quantized: product_input's (values, sum_error)."""
    y = F.linear(values, weight, bias)                                # [..., N]
    return y if sum_error is None else y.add_(F.linear(sum_error, mins))
