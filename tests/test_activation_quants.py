"""The activation quantizers of `--numerics llama-cpp` (pipeline/gguf_io/activation_quants.py) against
ggml's own (tests/ggml_cpu.py: the x86 SIMD code of the llama.cpp build llama-perplexity comes
from): the same bytes for every row, and, for each weight type, the product of the dequantized
weight with the quantized-and-dequantized row equal to ggml's integer dot product up to float
reassociation, where the product with the row as it is lies far away."""
import numpy as np
import pytest
import torch

from pipeline.gguf_io.activation_quants import block_mins, product, product_input, q8_0, q8_1, q8_k, vec_dot_type
from pipeline.gguf_io.dequant import dequantize
from pipeline.gguf_io.ggml_types import type_named

from . import ggml_cpu
from .ggml_reference import ggml_quantize

K = 1024   # four Q8_K blocks, thirty-two of Q8_0


def rows(seed: int) -> np.ndarray:
    """float32 [8, K]: normal rows and the cases rounding turns on: a zero block, values at exact
    half steps of the scale, a large outlier, a negative largest value, +a and -a both largest,
    subnormal-scaled values, and a row of activations as wide-ranging as a real model's."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((8, K)).astype(np.float32)
    x[1, :256] = 0.0
    x[2] = np.resize(np.float32([127.0, 0.5, -1.5, 2.5, -126.5, 63.5, 0.0, -0.5]), K)   # half steps of amax / 127
    x[3, 300] = 3e4
    x[4, ::32] = -40.0
    x[5, 10], x[5, 20] = 9.0, -9.0
    x[6] *= 1e-30
    x[7] *= np.exp(rng.uniform(-6, 6, K)).astype(np.float32)
    return x


def our_bytes(x: torch.Tensor, type_name: str) -> np.ndarray:
    """uint8 [blocks, type_size]: our quantized row laid out as ggml's block_q8_0 / _1 / _K."""
    if type_name == "Q8_0":
        d, q = q8_0(x)
        parts = [d.view(torch.uint8).view(-1, 2), q.view(torch.uint8)]
    elif type_name == "Q8_1":
        d, q, s = q8_1(x)
        parts = [d.view(torch.uint8).view(-1, 2), s.view(torch.uint8).view(-1, 2), q.view(torch.uint8)]
    else:
        d, q, sums = q8_k(x)
        parts = [d.view(torch.uint8).view(-1, 4), q.view(torch.uint8), sums.contiguous().view(torch.uint8)]
    return torch.cat([p.reshape(x.shape[-1] // (256 if type_name == "Q8_K" else 32), -1) for p in parts], 1).numpy()


@pytest.mark.parametrize("type_name", ["Q8_0", "Q8_1", "Q8_K"])
def test_rows_quantize_to_ggmls_bytes(type_name):
    """The bytes of each row ggml's; product_input's values, computed without the bytes, theirs."""
    quantize = {"Q8_0": q8_0, "Q8_1": q8_1, "Q8_K": q8_k}[type_name]
    for row in rows(seed=len(type_name) + ord(type_name[-1])):
        x = torch.from_numpy(row)
        np.testing.assert_array_equal(our_bytes(x, type_name), ggml_cpu.quantize_row(row, type_name))
        d, q = quantize(x)[:2]
        assert torch.equal(product_input(x, type_name)[0], (d.float().unsqueeze(-1) * q).flatten(-2))


WEIGHT_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS",
                "F16", "BF16"]


@pytest.mark.parametrize("weight_type", WEIGHT_TYPES)
def test_products_are_ggmls_integer_dot_products(weight_type):
    """Relative to the sum of |w x| over a row: ours within 2e-6 of ggml's on every row, the product
    of the unquantized rows at least 5e-5 from it on one (25 times as far)."""
    rng = np.random.default_rng(7)
    qtype = type_named(weight_type)
    ours_off, plain_off = [], []
    for x in rows(seed=3)[[0, 1, 3, 7]]:
        w = rng.standard_normal(K).astype(np.float32)
        raw = ggml_quantize(w.reshape(1, -1), qtype)
        weight = dequantize(raw, qtype)                                     # [1, K]
        mins = block_mins(raw, qtype)
        expected = ggml_cpu.dot(w, x, weight_type)
        row = torch.from_numpy(x).view(1, -1)
        ours = float(product(row, weight, None, vec_dot_type(qtype), mins))
        plain = float(row.double() @ weight.double().T)
        scale = float(row.double().abs() @ weight.double().abs().T)
        ours_off.append(abs(ours - expected) / scale)
        plain_off.append(abs(plain - expected) / scale)
    assert max(ours_off) <= 2e-6, ours_off
    if weight_type != "F16":   # a row rounded to float16 is near the row
        assert max(plain_off) >= 5e-5, plain_off
