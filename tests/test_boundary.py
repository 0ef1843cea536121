"""Boundary storage: dtypes, checksums, chunk bookkeeping (no model needed)."""
import numpy as np
import pytest
import torch

from pipeline.errors import UserError
from pipeline.store.arrays import ChunkedArray, decode, encode


def test_bfloat16_encoding_rounds_like_torch():
    x = np.random.default_rng(0).standard_normal(10_000).astype(np.float32) * 1e3
    ours = encode(x, "bfloat16")
    ref = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(ours, ref)
    np.testing.assert_array_equal(decode(ours, "bfloat16"), torch.from_numpy(x).to(torch.bfloat16).float().numpy())


def test_float16_refuses_values_beyond_its_range():
    with pytest.raises(UserError, match="beyond float16's range"):
        encode(np.array([1.0, 1.2e5], dtype=np.float32), "float16")


@pytest.mark.parametrize("dtype,stored", [("float32", "float32"), ("bfloat16", "uint16"), ("float16", "float16")])
def test_round_trip_and_recorded_dtype(tmp_path, dtype, stored):
    x = np.random.default_rng(1).standard_normal((5, 8, 16)).astype(np.float32)
    store = ChunkedArray.create(tmp_path / "b.zarr", x.shape, 2, dtype, {"identity": {}})
    for i in range(store.n_chunks):
        store.write_chunk(i, x[store.sequences(i)])
    back = ChunkedArray.open(tmp_path / "b.zarr")
    assert back.dtype == dtype and str(back.array.dtype) == stored and back.n_chunks == 3
    got = np.concatenate([back.read_chunk(i) for i in range(3)])
    tol = {"float32": 0, "bfloat16": 2 ** -8, "float16": 2 ** -11}[dtype]
    np.testing.assert_allclose(got, x, rtol=tol, atol=0)


def test_flipped_byte_is_detected_on_read(tmp_path):
    x = np.ones((4, 8, 16), dtype=np.float32)
    store = ChunkedArray.create(tmp_path / "b.zarr", x.shape, 2, "float32", {})
    store.write_chunk(0, x[:2]), store.write_chunk(1, x[2:])
    chunk = store.chunk_file(1)
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x01
    chunk.write_bytes(bytes(data))
    assert store.verified(0) and not store.verified(1)
    with pytest.raises(UserError, match="chunk 1 .* is corrupted"):
        store.read_chunk(1)


def test_a_chunk_of_zeros_is_stored_and_read_back(tmp_path):
    """An accumulator of experts that no token of a chunk was routed to is zero there: the chunk
    is written as any other, on creation and on resuming, never taken for one not computed."""
    created = ChunkedArray.create(tmp_path / "acc.zarr", (4, 3, 2), 2, "float32", {})
    created.write_chunk(0, np.zeros((2, 3, 2), np.float32))
    resumed = ChunkedArray.open_for_update(tmp_path / "acc.zarr")
    resumed.write_chunk(1, np.zeros((2, 3, 2), np.float32))
    for i in (0, 1):
        assert resumed.verified(i) and not ChunkedArray.open(tmp_path / "acc.zarr").read_chunk(i).any()
