"""Q1_0 and Q2_0, the types ggml has that gguf-py may not know: a file holding them opens, and
both dequantizing paths (the compiled host loops and the torch operations a GPU runs) give
ggml's dequantize_row_q1_0 / _q2_0 bit for bit. The reference blocks in tests/data were made by
ggml's own functions (tests/ggml_reference.py); where the llama.cpp build is on the machine,
they are made again and compared, with random blocks besides."""
import numpy as np
import pytest
import torch
from gguf import GGUFWriter

from pipeline.errors import UserError
from pipeline.gguf_io import dequant, host_dequant
from pipeline.gguf_io.dequant import dequantize
from pipeline.gguf_io.ggml_types import Q1_0, Q2_0, QUANT_SIZES, ggml_type, type_named
from pipeline.gguf_io.reader import GGUFIndex
from pipeline.model.arch.loading import read_tensor

from . import ggml_reference
from .ggml_reference import NEW_TYPES

needs_ggml = pytest.mark.skipif(not ggml_reference.LIBRARY.is_file(), reason="needs llama.cpp's libggml-base.so")


@pytest.fixture(scope="module")
def stored():
    with np.load(ggml_reference.STORED) as data:
        return {k: data[k] for k in data.files}


@pytest.fixture(params=["compiled", "torch"])
def path(request, monkeypatch):
    """The host's compiled loops, or the torch dequantizers a GPU runs, on the CPU."""
    monkeypatch.setattr(dequant, "COMPILED_LOOPS", [request.param == "compiled"])
    return request.param


def bits(x) -> np.ndarray:
    return np.asarray(x).view(np.uint32)


def random_blocks(qtype, n: int, seed: int) -> np.ndarray:
    """Random bytes: every field, the scale's bit patterns (NaNs, infinities) included."""
    return np.random.default_rng(seed).integers(0, 256, size=(n, QUANT_SIZES[qtype][1]), dtype=np.uint8)


def test_the_type_numbers_are_ggml_s_whatever_gguf_py_knows():
    assert (int(Q1_0), int(Q2_0)) == (41, 42)
    assert (Q1_0.name, Q2_0.name) == ("Q1_0", "Q2_0")
    assert ggml_type(41) is Q1_0 and type_named("Q2_0") is Q2_0
    assert QUANT_SIZES[Q1_0] == (128, 18) and QUANT_SIZES[Q2_0] == (64, 18)
    with pytest.raises(ValueError):
        ggml_type(43)


@pytest.mark.parametrize("qtype", NEW_TYPES, ids=lambda q: q.name)
def test_stored_blocks_dequantize_to_ggml_s_values(qtype, stored, path):
    """Every scale (zeros, subnormals, infinities, NaNs of both signs) with every code pattern,
    and blocks ggml's quantizer made: float32 bit for bit."""
    blocks, values = stored[f"{qtype.name}_blocks"], stored[f"{qtype.name}_values"]
    rows = blocks.reshape(4, -1)                                     # rows of several blocks
    ours = dequantize(rows, qtype).numpy().reshape(values.shape)
    np.testing.assert_array_equal(bits(ours), bits(values))


def same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """float32: the same bits; bfloat16: the same bits but for NaNs, NaN in the same places
    (torch's own rounding of a NaN to bfloat16 keeps no one pattern)."""
    if a.dtype == torch.float32:
        return torch.equal(a.view(torch.int32), b.view(torch.int32))
    nan = b.isnan()
    return torch.equal(a.isnan(), nan) and torch.equal(a[~nan].view(torch.int16), b[~nan].view(torch.int16))


@pytest.mark.parametrize("qtype", NEW_TYPES, ids=lambda q: q.name)
def test_bfloat16_is_ggml_s_float32_rounded_as_torch_rounds(qtype, stored, path):
    blocks, values = stored[f"{qtype.name}_blocks"], stored[f"{qtype.name}_values"]
    ours = dequantize(blocks, qtype, dtype=torch.bfloat16).reshape(values.shape)
    assert same_values(ours, torch.from_numpy(values).to(torch.bfloat16))


@pytest.mark.parametrize("qtype", NEW_TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_host_loops_and_the_torch_path_agree_bit_for_bit(qtype, dtype, monkeypatch):
    raw = random_blocks(qtype, 4096, seed=int(qtype)).reshape(64, -1)
    monkeypatch.setattr(dequant, "COMPILED_LOOPS", [True])
    assert host_dequant.handles(qtype, dtype)
    compiled = dequantize(raw, qtype, dtype=dtype)
    monkeypatch.setattr(dequant, "COMPILED_LOOPS", [False])
    assert same_values(compiled, dequantize(raw, qtype, dtype=dtype))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("qtype", NEW_TYPES, ids=lambda q: q.name)
def test_on_a_gpu_the_values_are_ggml_s(qtype, stored):
    """Bit for bit but for NaNs, NaN in the same places: a GPU's product with a NaN scale (Q2_0)
    gives its one NaN pattern."""
    blocks, values = stored[f"{qtype.name}_blocks"], stored[f"{qtype.name}_values"]
    ours = dequantize(blocks, qtype, device="cuda").cpu().reshape(values.shape)
    ref = torch.from_numpy(values)
    nan = ref.isnan()
    assert torch.equal(ours.isnan(), nan)
    assert torch.equal(ours[~nan].view(torch.int32), ref[~nan].view(torch.int32))


def write_gguf(path, tensors: dict) -> None:
    """A GGUF of `tensors` (name -> (uint8 rows, type number)), written by gguf-py: the bytes as
    int8, so its writer takes the shape in values and the type number as given."""
    w = GGUFWriter(str(path), "llama")
    for name, (raw, number) in tensors.items():
        block, type_size = QUANT_SIZES.get(number, (1, 1))   # a number no one defines: bytes as values
        shape = (*raw.shape[:-1], raw.shape[-1] // type_size * block)
        w.add_tensor(name, raw.view(np.int8), raw_shape=shape, raw_dtype=number)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_a_gguf_tensor_of_each_type_is_read_whole(stored, tmp_path):
    """Through the reader and read_tensor, as a layer's weights are read."""
    tensors = {f"blk.0.{q.name}.weight": (stored[f"{q.name}_blocks"][:16].reshape(4, -1), int(q)) for q in NEW_TYPES}
    write_gguf(tmp_path / "m.gguf", tensors)
    index = GGUFIndex(tmp_path / "m.gguf")
    for qtype in NEW_TYPES:
        name, block = f"blk.0.{qtype.name}.weight", QUANT_SIZES[qtype][0]
        assert index.tensors[name].qtype == qtype and index.tensors[name].shape == (4, 4 * block)
        out = read_tensor(index, name, "cpu", torch.float32)
        np.testing.assert_array_equal(bits(out.numpy()), bits(stored[f"{qtype.name}_values"][:16].reshape(4, -1)))


def test_a_type_number_ggml_does_not_define_is_still_refused_in_one_line(tmp_path):
    write_gguf(tmp_path / "m.gguf", {"blk.0.ffn_up.weight": (np.zeros((2, 18), np.uint8), 43)})
    with pytest.raises(UserError, match=r"tensor blk.0.ffn_up.weight has unknown GGML type 43$"):
        GGUFIndex(tmp_path / "m.gguf")


@needs_ggml
def test_ggml_s_sizes_are_ours():
    for qtype in NEW_TYPES:
        traits = ggml_reference.traits(qtype)
        assert (traits.type_name.decode(), traits.blck_size, traits.type_size) == (
            qtype.name.lower(), *QUANT_SIZES[qtype])


@needs_ggml
def test_the_stored_blocks_are_ggml_s_own(stored):
    made = ggml_reference.reference_data()
    assert made.keys() == stored.keys()
    for key, value in made.items():
        np.testing.assert_array_equal(value.view(np.uint8), stored[key].view(np.uint8), err_msg=key)


@needs_ggml
@pytest.mark.parametrize("qtype", NEW_TYPES, ids=lambda q: q.name)
def test_random_blocks_dequantize_to_ggml_s_values(qtype, path):
    raw = random_blocks(qtype, 4096, seed=7)
    ours = dequantize(raw.reshape(64, -1), qtype).numpy().reshape(4096, -1)
    np.testing.assert_array_equal(bits(ours), bits(ggml_reference.ggml_dequantize(raw, qtype)))
