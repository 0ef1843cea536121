"""The torch dequantizers equal gguf-py's numpy dequantizers bit for bit."""
import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, quants
from gguf import GGMLQuantizationType as Q

from pipeline.errors import UserError
from pipeline.gguf_io.dequant import BLOCK_DEQUANTIZERS, dequantize

QUANTIZABLE = [Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0]
K_QUANTS = [Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K]
GRID_AND_TERNARY = [Q.IQ4_NL, Q.IQ4_XS, Q.MXFP4, Q.TQ1_0, Q.TQ2_0]


def random_blocks(qtype: Q, rows: int, row_blocks: int, seed: int) -> np.ndarray:
    """Random bytes in every field, with the fp16 scales kept finite."""
    rng = np.random.default_rng(seed)
    block, type_size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows * row_blocks, type_size), dtype=np.uint8)
    if qtype in K_QUANTS or qtype in QUANTIZABLE[2:] or qtype in GRID_AND_TERNARY:
        finite = rng.standard_normal((rows * row_blocks, 2)).astype(np.float16).view(np.uint8)
        for start in _fp16_offsets(qtype):
            raw[:, start:start + 2] = finite[:, :2]
    return raw.reshape(rows, row_blocks * type_size)


def _fp16_offsets(qtype: Q) -> list[int]:
    return {Q.Q4_0: [0], Q.Q5_0: [0], Q.Q8_0: [0], Q.Q4_1: [0, 2], Q.Q5_1: [0, 2],
            Q.Q2_K: [80, 82], Q.Q3_K: [108], Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208],
            Q.IQ4_NL: [0], Q.IQ4_XS: [0], Q.MXFP4: [], Q.TQ1_0: [52], Q.TQ2_0: [64]}[qtype]


@pytest.mark.parametrize("qtype", K_QUANTS + QUANTIZABLE[2:] + GRID_AND_TERNARY)
def test_random_blocks_match_gguf(qtype):
    raw = random_blocks(qtype, rows=8, row_blocks=3, seed=int(qtype))
    ours = dequantize(raw, qtype).numpy()
    ref = quants.dequantize(raw, qtype)
    assert ours.shape == ref.shape
    np.testing.assert_array_equal(ours.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("qtype", [Q.F32] + QUANTIZABLE)
def test_quantized_weights_match_gguf(qtype):
    values = np.random.default_rng(0).standard_normal((6, 256)).astype(np.float32) * 3
    stored = values if qtype == Q.F32 else quants.quantize(values, qtype)
    ours = dequantize(stored.view(np.uint8), qtype).numpy()  # GGUF tensors are read as bytes
    ref = values if qtype == Q.F32 else quants.dequantize(stored, qtype)
    np.testing.assert_array_equal(ours.view(np.uint32), ref.view(np.uint32))


def test_every_listed_type_has_a_torch_dequantizer():
    listed = {Q.F32, Q.F16, Q.BF16, *QUANTIZABLE, *K_QUANTS, *GRID_AND_TERNARY}
    assert listed <= set(BLOCK_DEQUANTIZERS)


def iq2_xxs_blocks(rows: int, row_blocks: int, seed: int) -> np.ndarray:
    """Random IQ2_XXS blocks (a type still dequantized by gguf-py) with finite scales."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(rows * row_blocks, GGML_QUANT_SIZES[Q.IQ2_XXS][1]), dtype=np.uint8)
    raw[:, :2] = rng.standard_normal((rows * row_blocks, 1)).astype(np.float16).view(np.uint8)
    return raw.reshape(rows, -1)


def test_other_types_fall_back_to_gguf():
    raw = iq2_xxs_blocks(rows=2, row_blocks=2, seed=1)
    np.testing.assert_array_equal(dequantize(raw, Q.IQ2_XXS).numpy(), quants.dequantize(raw, Q.IQ2_XXS))


def test_the_gguf_py_fallback_goes_piece_by_piece(monkeypatch):
    """A type without a torch dequantizer is never copied whole: gguf-py sees one piece at a time."""
    block, _ = GGML_QUANT_SIZES[Q.IQ2_XXS]
    raw = iq2_xxs_blocks(rows=6, row_blocks=5, seed=4)
    seen, real = [], quants.dequantize
    monkeypatch.setattr(quants, "dequantize", lambda data, qtype: seen.append(data.shape) or real(data, qtype))
    monkeypatch.setattr("pipeline.gguf_io.dequant.PIECE_VALUES", 4 * block)
    out = dequantize(raw, Q.IQ2_XXS, dtype=torch.bfloat16)
    assert seen and max(shape[0] for shape in seen) == 4 and sum(shape[0] for shape in seen) == 30
    assert torch.equal(out, torch.from_numpy(real(raw, Q.IQ2_XXS)).to(torch.bfloat16))


def test_unsupported_type_names_tensor_and_type():
    raw = np.zeros((1, GGML_QUANT_SIZES[Q.Q8_K][1]), dtype=np.uint8)
    with pytest.raises(UserError, match="blk.3.ffn_up.weight.*Q8_K"):
        dequantize(raw, Q.Q8_K, name="blk.3.ffn_up.weight")


def test_dequantizes_on_the_requested_device():
    raw = random_blocks(Q.Q4_K, rows=2, row_blocks=1, seed=3)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = dequantize(raw, Q.Q4_K, device=device)
    assert out.device.type == device and out.dtype == torch.float32
    np.testing.assert_array_equal(out.cpu().numpy(), quants.dequantize(raw, Q.Q4_K))


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q6_K])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_piecewise_dequantization_in_the_compute_dtype(qtype, dtype, monkeypatch):
    """Pieces that end inside a row give gguf-py's float32 values, cast to the compute dtype."""
    block, _ = GGML_QUANT_SIZES[qtype]
    monkeypatch.setattr("pipeline.gguf_io.dequant.PIECE_VALUES", 3 * block)  # rows are 5 blocks long
    raw = random_blocks(qtype, rows=7, row_blocks=5, seed=11)
    out = dequantize(raw, qtype, dtype=dtype)
    assert out.dtype == dtype and out.shape == (7, 5 * block)
    expected = torch.from_numpy(quants.dequantize(raw, qtype)).to(dtype)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("qtype", [Q.IQ4_NL, Q.Q5_0, Q.Q8_0])
@pytest.mark.parametrize("row", [576, 4864])   # SmolLM2's hidden size, Qwen2.5-0.5B's FFN: not multiples of 256
def test_rows_that_are_not_a_multiple_of_256(qtype, row, monkeypatch):
    """The types quantizers fall back to for such rows, over pieces that end inside a row."""
    block, _ = GGML_QUANT_SIZES[qtype]
    monkeypatch.setattr("pipeline.gguf_io.dequant.PIECE_VALUES", 7 * block)
    raw = random_blocks(qtype, rows=12, row_blocks=row // block, seed=row)
    np.testing.assert_array_equal(dequantize(raw, qtype).numpy().view(np.uint32),
                                  quants.dequantize(raw, qtype).view(np.uint32))
