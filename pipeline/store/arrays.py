"""Zarr stores: the sequence plan (token ids), boundaries (hidden state at a layer cut) and
per-token scores.

Arrays are chunked along their first axis by whole sequences (`per_chunk` of them),
compressed with Blosc/LZ4 and carry a crc32c checksum per chunk, so a damaged chunk is
detected when it is read. A boundary is [n_sequences, ctx, hidden], read and written as float32
and stored as float32, float16 or bfloat16; Zarr has no bfloat16, so those are stored as the
uint16 bit patterns with the real dtype recorded in the attributes. Knows no model.
"""
from pathlib import Path

import numpy as np
import zarr
from zarr.codecs import BloscCodec, Crc32cCodec

from ..errors import UserError
from ..run.corpus_plan import SequencePlan


def _codecs():
    # bit-shuffled LZ4: activations shrink by 7% (float32) to 14% (bfloat16), as much as with
    # zstd, at a quarter of its time (9 -> 2 ms to write a 4.7 MB chunk)
    return [BloscCodec(cname="lz4", clevel=1, shuffle="bitshuffle"), Crc32cCodec()]


FLOAT16_MAX = 65504.0
STORED_AS = {"float32": "float32", "float16": "float16", "bfloat16": "uint16", "float64": "float64"}


def encode(x: np.ndarray, dtype: str) -> np.ndarray:
    """float values -> what is stored for `dtype` (bfloat16: round to nearest even)."""
    if dtype == "bfloat16":
        bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    if dtype == "float16":
        peak = float(np.abs(x).max()) if x.size else 0.0
        if not peak <= FLOAT16_MAX:
            raise UserError(f"the hidden state reaches {peak:.3g}, beyond float16's range of {FLOAT16_MAX:g}: "
                            f"use --boundary-dtype bfloat16 or float32 for this model")
    return x.astype(STORED_AS[dtype], copy=False)


def decode(stored: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return (stored.astype(np.uint32) << 16).view(np.float32)
    return stored.astype(np.float64 if dtype == "float64" else np.float32, copy=False)


# a chunk equal to the fill value is written too: a missing chunk file means "not computed" (a
# slice of experts that no token of a chunk was routed to leaves its accumulator zero there)
EVERY_CHUNK = {"write_empty_chunks": True}


class ChunkedArray:
    def __init__(self, path: Path, array: zarr.Array):
        self.path, self.array = path, array  # a local Path or an object store's UPath
        self.per_chunk = array.chunks[0]

    @classmethod
    def create(cls, path: Path, shape: tuple[int, ...], per_chunk: int, dtype: str,
               attrs: dict) -> "ChunkedArray":
        array = zarr.create_array(store=str(path), shape=shape, chunks=(per_chunk, *shape[1:]),
                                  dtype=STORED_AS[dtype], compressors=_codecs(), fill_value=0,
                                  attributes={**attrs, "dtype": dtype}, overwrite=True, config=EVERY_CHUNK)
        return cls(path, array)

    @classmethod
    def open(cls, path: Path) -> "ChunkedArray":
        if not (path / "zarr.json").is_file():
            raise UserError(f"{path} is missing: its task output is incomplete or was removed")
        return cls(path, zarr.open_array(str(path), mode="r"))

    @classmethod
    def open_for_update(cls, path: Path) -> "ChunkedArray":
        """Reopen an array left by an interrupted task, dropping half-written chunk files
        (Zarr writes `<key>.<uuid>.partial` and renames it into place)."""
        for leftover in path.rglob("*.partial"):
            leftover.unlink()
        return cls(path, zarr.open_array(str(path), mode="r+").with_config(EVERY_CHUNK))

    @property
    def attrs(self) -> dict:
        return self.array.attrs.asdict()

    @property
    def dtype(self) -> str:
        return self.attrs["dtype"]

    @property
    def n_chunks(self) -> int:
        return -(-self.array.shape[0] // self.per_chunk)

    def sequences(self, i: int) -> slice:
        """The sequences (rows along the first axis) of chunk i."""
        return slice(i * self.per_chunk, min((i + 1) * self.per_chunk, self.array.shape[0]))

    def chunk_file(self, i: int) -> Path:
        return self.path.joinpath("c", str(i), *["0"] * (self.array.ndim - 1))

    def verified(self, i: int) -> bool:
        """Chunk i was written whole and its checksum holds."""
        if not self.chunk_file(i).is_file():
            return False
        try:
            self.array[self.sequences(i)]
        except ValueError:
            return False
        return True

    def read_chunk(self, i: int) -> np.ndarray:
        if not self.chunk_file(i).is_file():  # Zarr would return its fill value: never compute on it
            raise UserError(f"chunk {i} of {self.path} is missing; the output was removed or damaged: "
                            f"delete that task's folder ({self.path.parent}) and rerun to recompute it")
        try:
            return decode(self.array[self.sequences(i)], self.dtype)
        except ValueError as e:
            raise UserError(f"chunk {i} of {self.path} is corrupted ({e}); delete that task's "
                            f"folder ({self.path.parent}) and rerun to recompute it") from None

    def write_chunk(self, i: int, data: np.ndarray) -> None:
        self.array[self.sequences(i)] = encode(data, self.dtype)


PACKING = ("span_rows", "first_from", "layout")    # a packed plan's arrays beside ids and the spans


def save_plan(path: Path, tokens: np.ndarray, plan: SequencePlan, per_chunk: int, attrs: dict) -> None:
    group = zarr.open_group(str(path), mode="w", attributes=attrs)
    group.create_array("tokens", data=np.asarray(tokens, dtype=np.int32), compressors=_codecs())
    group.create_array("ids", data=plan.ids, chunks=(per_chunk, plan.ids.shape[1]), compressors=_codecs())
    group.create_array("score_lo", data=plan.score_lo, compressors=_codecs())
    group.create_array("score_hi", data=plan.score_hi, compressors=_codecs())
    for name in PACKING:
        if (data := getattr(plan, name)) is not None:
            group.create_array(name, data=data, compressors=_codecs())


def load_tokens(path: Path) -> np.ndarray:
    """Every token id of the corpus a Tokenize output holds, as it tokenized them."""
    return zarr.open_group(str(path), mode="r")["tokens"][:]


def load_plan(path: Path) -> tuple[SequencePlan, dict]:
    group = zarr.open_group(str(path), mode="r")
    attrs = group.attrs.asdict()
    # "available_windows": the attribute's name in every tokens.zarr written so far
    packing = {name: group[name][:] for name in PACKING if name in group}
    plan = SequencePlan(group["ids"][:], group["score_lo"][:], group["score_hi"][:], attrs["available_windows"],
                        **packing)
    return plan, attrs
