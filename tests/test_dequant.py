"""The dequantizers (the compiled host loops and the torch ones a GPU runs) equal gguf-py's numpy
dequantizers bit for bit."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, quants
from gguf import GGMLQuantizationType as Q

from pipeline.errors import UserError
from pipeline.gguf_io import dequant, host_dequant
from pipeline.gguf_io.dequant import BLOCK_DEQUANTIZERS, Uploads, dequantize
from pipeline.gguf_io.ggml_types import Q1_0, Q2_0

QUANTIZABLE = [Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0]
K_QUANTS = [Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K]
OTHER_TYPES = [Q.IQ4_NL, Q.IQ4_XS, Q.MXFP4, Q.NVFP4, Q.TQ1_0, Q.TQ2_0, Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS,
               Q.IQ3_S, Q.IQ1_S]
GGML_ONLY = [Q1_0, Q2_0]   # no gguf-py dequantizer: checked against ggml's own in test_one_two_bit_types.py


def random_blocks(qtype: Q, rows: int, row_blocks: int, seed: int) -> np.ndarray:
    """Random bytes in every field, with the fp16 scales kept finite."""
    rng = np.random.default_rng(seed)
    block, type_size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows * row_blocks, type_size), dtype=np.uint8)
    if qtype in K_QUANTS or qtype in QUANTIZABLE[2:] or qtype in OTHER_TYPES:
        finite = rng.standard_normal((rows * row_blocks, 2)).astype(np.float16).view(np.uint8)
        for start in _fp16_offsets(qtype):
            raw[:, start:start + 2] = finite[:, :2]
    return raw.reshape(rows, row_blocks * type_size)


def _fp16_offsets(qtype: Q) -> list[int]:
    return {Q.Q4_0: [0], Q.Q5_0: [0], Q.Q8_0: [0], Q.Q4_1: [0, 2], Q.Q5_1: [0, 2],
            Q.Q2_K: [80, 82], Q.Q3_K: [108], Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208],
            Q.IQ4_NL: [0], Q.IQ4_XS: [0], Q.MXFP4: [], Q.NVFP4: [], Q.TQ1_0: [52], Q.TQ2_0: [64],
            Q.IQ2_XXS: [0], Q.IQ2_XS: [0], Q.IQ2_S: [0], Q.IQ3_XXS: [0], Q.IQ3_S: [0], Q.IQ1_S: [0]}[qtype]


@pytest.fixture(params=["compiled", "torch"])
def path(request, monkeypatch):
    """The host's compiled loops, or the torch dequantizers a GPU runs, on the CPU."""
    monkeypatch.setattr(dequant, "COMPILED_LOOPS", [request.param == "compiled"])
    return request.param


@pytest.mark.parametrize("qtype", K_QUANTS + QUANTIZABLE[2:] + OTHER_TYPES)
def test_random_blocks_match_gguf(qtype, path):
    raw = random_blocks(qtype, rows=8, row_blocks=3, seed=int(qtype))
    ours = dequantize(raw, qtype).numpy()
    ref = quants.dequantize(raw, qtype)
    assert ours.shape == ref.shape
    np.testing.assert_array_equal(ours.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("qtype", [Q.F32] + QUANTIZABLE)
def test_quantized_weights_match_gguf(qtype, path):
    values = np.random.default_rng(0).standard_normal((6, 256)).astype(np.float32) * 3
    stored = values if qtype == Q.F32 else quants.quantize(values, qtype)
    ours = dequantize(stored.view(np.uint8), qtype).numpy()  # GGUF tensors are read as bytes
    ref = values if qtype == Q.F32 else quants.dequantize(stored, qtype)
    np.testing.assert_array_equal(ours.view(np.uint32), ref.view(np.uint32))


def test_every_listed_type_has_a_torch_dequantizer():
    listed = {Q.F32, Q.F16, Q.BF16, *QUANTIZABLE, *K_QUANTS, *OTHER_TYPES, *GGML_ONLY}
    assert listed <= set(BLOCK_DEQUANTIZERS)


def test_a_type_without_a_torch_dequantizer_goes_through_gguf_py_piece_by_piece(monkeypatch):
    """A type the torch table lacks (Q8_0 taken out here) is dequantized by gguf-py, one piece
    at a time, never copied whole, with gguf-py's values cast to the compute dtype."""
    monkeypatch.delitem(BLOCK_DEQUANTIZERS, Q.Q8_0)
    monkeypatch.setattr(dequant, "COMPILED_LOOPS", [True])
    monkeypatch.delitem(host_dequant.KERNELS, Q.Q8_0)
    block, _ = GGML_QUANT_SIZES[Q.Q8_0]
    raw = random_blocks(Q.Q8_0, rows=6, row_blocks=5, seed=4)
    seen, real = [], quants.dequantize
    monkeypatch.setattr(quants, "dequantize", lambda data, qtype: seen.append(data.shape) or real(data, qtype))
    monkeypatch.setattr("pipeline.gguf_io.dequant.PIECE_VALUES", 4 * block)
    out = dequantize(raw, Q.Q8_0, dtype=torch.bfloat16)
    assert seen and max(shape[0] for shape in seen) == 4 and sum(shape[0] for shape in seen) == 30
    assert torch.equal(out, torch.from_numpy(real(raw, Q.Q8_0)).to(torch.bfloat16))


def iq1_m_blocks(rows: int, delta_bits: int | None, seed: int) -> np.ndarray:
    """Random IQ1_M blocks with a finite fp16 scale (spread over the top nibbles of the four
    scale words) and the groups' delta sign bits as `delta_bits` sets them in each byte (0x88:
    both set, 0x00: neither, 0x80 or 0x08: one; None: random)."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(rows, GGML_QUANT_SIZES[Q.IQ1_M][1]), dtype=np.uint8)
    scale = rng.standard_normal(rows).astype(np.float16).view(np.uint16).astype(np.uint16)
    words = raw[:, 48:56].copy().view(np.uint16) & np.uint16(0x0FFF)
    for k in range(4):
        words[:, k] |= ((scale >> (4 * k)) & 0xF).astype(np.uint16) << 12
    raw[:, 48:56] = words.view(np.uint8)
    if delta_bits is not None:
        raw[:, 32:48] = (raw[:, 32:48] & 0x77) | delta_bits
    return raw


@pytest.mark.parametrize("delta_bits", [0x88, 0x00, 0x80, 0x08, None])
def test_iq1_m_matches_gguf_with_either_delta_sign(delta_bits):
    raw = iq1_m_blocks(rows=16, delta_bits=delta_bits, seed=5)
    np.testing.assert_array_equal(dequantize(raw, Q.IQ1_M).numpy().view(np.uint32),
                                  quants.dequantize(raw, Q.IQ1_M).view(np.uint32))


def test_iq1_m_reads_the_delta_sign_as_ggml_does():
    # ggml: delta = qh & 0x08 ? -IQ1S_DELTA : +IQ1S_DELTA per group of 8, as gguf-py's (qh & 0x08) == 0.
    # One block of scale 1.0 (fp16 0x3C00 in the scale words' top nibbles), group scales 0 (dl = 1), grid entry 0.
    block = np.zeros((2, GGML_QUANT_SIZES[Q.IQ1_M][1]), dtype=np.uint8)
    words = np.zeros((2, 4), dtype=np.uint16)
    words[:, 2], words[:, 3] = 0xC << 12, 0x3 << 12
    block[:, 48:56] = words.view(np.uint8)
    block[0, 32:48] = 0x88                                   # row 0: every delta bit set, row 1: none
    ours = dequantize(block, Q.IQ1_M).numpy()
    grid0 = quants.IQ1_S.grid.reshape(-1, 8)[0]
    np.testing.assert_array_equal(ours[0], np.tile(grid0 - np.float32(0.125), 32))
    np.testing.assert_array_equal(ours[1], np.tile(grid0 + np.float32(0.125), 32))
    np.testing.assert_array_equal(ours, quants.dequantize(block, Q.IQ1_M))


def test_unsupported_type_names_tensor_and_type():
    raw = np.zeros((1, GGML_QUANT_SIZES[Q.Q8_K][1]), dtype=np.uint8)
    with pytest.raises(UserError, match="blk.3.ffn_up.weight.*Q8_K"):
        dequantize(raw, Q.Q8_K, name="blk.3.ffn_up.weight")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device"))])
def test_dequantizes_on_the_requested_device(device):
    raw = random_blocks(Q.Q4_K, rows=2, row_blocks=1, seed=3)
    out = dequantize(raw, Q.Q4_K, device=device)
    assert out.device.type == device and out.dtype == torch.float32
    np.testing.assert_array_equal(out.cpu().numpy(), quants.dequantize(raw, Q.Q4_K))


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q6_K])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_piecewise_dequantization_in_the_compute_dtype(qtype, dtype, monkeypatch):
    """Pieces that end inside a row give gguf-py's float32 values, cast to the compute dtype."""
    monkeypatch.setattr(dequant, "COMPILED_LOOPS", [False])
    block, _ = GGML_QUANT_SIZES[qtype]
    monkeypatch.setattr("pipeline.gguf_io.dequant.PIECE_VALUES", 3 * block)  # rows are 5 blocks long
    raw = random_blocks(qtype, rows=7, row_blocks=5, seed=11)
    out = dequantize(raw, qtype, dtype=dtype)
    assert out.dtype == dtype and out.shape == (7, 5 * block)
    expected = torch.from_numpy(quants.dequantize(raw, qtype)).to(dtype)
    assert torch.equal(out, expected)


def test_every_bfloat16_bit_pattern_widens_to_its_float32_bits():
    """A bfloat16 is the top half of a float32: all 65,536 patterns, NaNs and infinities included."""
    patterns = np.arange(1 << 16, dtype=np.uint32)
    raw = patterns.astype(np.uint16).view(np.uint8).reshape(-1, 2)
    out = dequantize(raw, Q.BF16, dtype=torch.float32).view(torch.int32).numpy().view(np.uint32)
    np.testing.assert_array_equal(out.reshape(-1), patterns << 16)


@pytest.mark.parametrize("qtype, dtype", [(Q.BF16, torch.bfloat16), (Q.F16, torch.float16), (Q.F32, torch.float32)])
def test_a_float_tensor_in_its_own_dtype_is_its_bytes(qtype, dtype):
    """BF16 into bfloat16 (a bfloat16 base computed in bfloat16), F16 into float16, F32 into
    float32: the file's bytes, copied once, equal to gguf-py's values cast to the dtype."""
    values = np.random.default_rng(5).standard_normal((6, 40)).astype(np.float32) * 100
    raw = quants.quantize(values, qtype).view(np.uint8).reshape(6, -1)
    out = dequantize(np.ascontiguousarray(raw), qtype, dtype=dtype)
    assert out.dtype == dtype and out.shape == (6, 40)
    assert torch.equal(out, torch.from_numpy(quants.dequantize(raw, qtype)).to(dtype))
    assert out.view(torch.uint8).numpy().tobytes() == raw.tobytes()


@pytest.mark.parametrize("qtype", [Q.IQ4_NL, Q.Q5_0, Q.Q8_0])
@pytest.mark.parametrize("row", [576, 4864])   # SmolLM2's hidden size, Qwen2.5-0.5B's FFN: not multiples of 256
def test_rows_that_are_not_a_multiple_of_256(qtype, row, path, monkeypatch):
    """The types quantizers fall back to for such rows, over pieces that end inside a row."""
    block, _ = GGML_QUANT_SIZES[qtype]
    monkeypatch.setattr("pipeline.gguf_io.dequant.PIECE_VALUES", 7 * block)
    raw = random_blocks(qtype, rows=12, row_blocks=row // block, seed=row)
    np.testing.assert_array_equal(dequantize(raw, qtype).numpy().view(np.uint32),
                                  quants.dequantize(raw, qtype).view(np.uint32))


class LateCopies(Uploads):
    """A GPU stand-in whose host-to-device copies run only when an event after them is waited
    for, as on a busy stream: a staging buffer refilled too early shows in the pieces."""
    _staging, _copied = {}, {}

    def __init__(self, stream: list):
        super().__init__(torch.device("cpu"))
        self.gpu, self.stream = True, stream

    def staging(self, nbytes):
        return torch.empty(nbytes, dtype=torch.uint8)

    def upload(self, buf):
        piece = torch.empty_like(buf)
        self.stream.append((piece, buf))
        return piece, SimpleNamespace(synchronize=lambda: catch_up(self.stream))


def catch_up(stream: list) -> None:
    for piece, buf in stream:
        piece.copy_(buf)
    stream.clear()


def test_a_staging_buffer_waits_for_the_copy_of_the_previous_tensor():
    """Single-piece tensors back to back (norms, biases) each use buffer 0: the second may not
    overwrite it while the first one's copy is still queued."""
    stream = []
    pieces = [piece for value in (1, 2, 3)
              for _, piece in LateCopies(stream).pieces(np.full((1, 18), value, np.uint8), 4)]
    catch_up(stream)
    assert [int(p[0, 0]) for p in pieces] == [1, 2, 3]


def test_the_common_file_types_have_compiled_host_loops():
    """The types 30B files are made of load in one compiled pass into either compute dtype."""
    for qtype in (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, *K_QUANTS, Q.IQ4_NL, Q.IQ4_XS, Q.MXFP4):
        assert host_dequant.handles(qtype, torch.float32) and host_dequant.handles(qtype, torch.bfloat16)


@pytest.mark.parametrize("qtype", sorted(set(host_dequant.KERNELS) - set(GGML_ONLY)))
def test_compiled_loops_round_to_bfloat16_as_torch_does(qtype, monkeypatch):
    """Into bfloat16: gguf-py's float32 values rounded as torch rounds them, ties to even, with
    every scale bit pattern (infinities and NaNs among them) and random quants."""
    monkeypatch.setattr(dequant, "COMPILED_LOOPS", [True])
    block, type_size = GGML_QUANT_SIZES[qtype]
    raw = np.random.default_rng(int(qtype)).integers(0, 256, size=(4096, type_size), dtype=np.uint8)
    ours = dequantize(raw, qtype, dtype=torch.bfloat16)
    with np.errstate(all="ignore"):
        ref = torch.from_numpy(quants.dequantize(raw, qtype).reshape(ours.shape)).to(torch.bfloat16)
    nan = ref.isnan()
    assert torch.equal(ours.isnan(), nan)
    assert torch.equal(ours[~nan].view(torch.int16), ref[~nan].view(torch.int16))


@pytest.mark.parametrize("file_bytes, started", [(80 << 20, False), (dequant.COMPILED_LOOPS_FROM_BYTES, True)])
def test_a_pass_starts_the_compiled_loops_where_they_pay_for_their_start(file_bytes, started, monkeypatch):
    """A pass over a small model keeps the torch operations (numba's start would cost more than it
    saves); from the threshold on, the loops start, and every later tensor takes them."""
    monkeypatch.setattr(dequant, "COMPILED_LOOPS", [False])
    taken = []
    monkeypatch.setattr(host_dequant, "dequantize_into", lambda blocks, qtype, out: taken.append(qtype))
    dequant.plan_host_load(file_bytes)
    dequantize(random_blocks(Q.Q4_K, rows=2, row_blocks=1, seed=3), Q.Q4_K)
    assert taken == ([Q.Q4_K] if started else [])
