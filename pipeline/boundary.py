"""Zarr stores: the window plan (token ids) and the boundaries (hidden state at a layer cut).

A boundary is a float32 array [n_windows, ctx, hidden] chunked by whole corpus windows
(`per_chunk` of them), compressed with Blosc/zstd and carrying a crc32c checksum per chunk,
so a damaged chunk is detected when it is read. Knows no model.
"""
from pathlib import Path

import numpy as np
import zarr
from zarr.codecs import BloscCodec, Crc32cCodec

from .errors import UserError
from .plan import WindowPlan


def _codecs():
    # bit-shuffled zstd at level 1: cheap to write, and float32 activations still shrink a little
    return [BloscCodec(cname="zstd", clevel=1, shuffle="bitshuffle"), Crc32cCodec()]


class Boundary:
    def __init__(self, path: Path, array: zarr.Array):
        self.path, self.array = Path(path), array
        self.per_chunk = array.chunks[0]

    @classmethod
    def create(cls, path: Path, n_windows: int, ctx: int, hidden: int, per_chunk: int,
               attrs: dict) -> "Boundary":
        array = zarr.create_array(store=str(path), shape=(n_windows, ctx, hidden),
                                  chunks=(per_chunk, ctx, hidden), dtype="float32",
                                  compressors=_codecs(), fill_value=0.0, attributes=attrs,
                                  overwrite=True)
        return cls(path, array)

    @classmethod
    def open(cls, path: Path) -> "Boundary":
        return cls(path, zarr.open_array(str(path), mode="r"))

    @classmethod
    def open_for_update(cls, path: Path) -> "Boundary":
        """Reopen a boundary left by an interrupted task, dropping half-written chunk files
        (Zarr writes `<key>.<uuid>.partial` and renames it into place)."""
        for leftover in Path(path).rglob("*.partial"):
            leftover.unlink()
        return cls(path, zarr.open_array(str(path), mode="r+"))

    @property
    def n_chunks(self) -> int:
        return -(-self.array.shape[0] // self.per_chunk)

    def windows(self, i: int) -> slice:
        return slice(i * self.per_chunk, min((i + 1) * self.per_chunk, self.array.shape[0]))

    def has_chunk(self, i: int) -> bool:
        return (self.path / "c" / str(i) / "0" / "0").is_file()

    def verified(self, i: int) -> bool:
        """Chunk i was written whole and its checksum holds."""
        if not self.has_chunk(i):
            return False
        try:
            self.array[self.windows(i)]
        except ValueError:
            return False
        return True

    def read_chunk(self, i: int) -> np.ndarray:
        # [per_chunk, ctx, hidden] float32
        try:
            return self.array[self.windows(i)]
        except ValueError as e:
            raise UserError(f"chunk {i} of {self.path} is corrupted ({e})") from None

    def write_chunk(self, i: int, data: np.ndarray) -> None:
        self.array[self.windows(i)] = data


def save_plan(path: Path, tokens: np.ndarray, plan: WindowPlan, per_chunk: int, attrs: dict) -> None:
    group = zarr.open_group(str(path), mode="w", attributes=attrs)
    group.create_array("tokens", data=np.asarray(tokens, dtype=np.int32), compressors=_codecs())
    group.create_array("ids", data=plan.ids, chunks=(per_chunk, plan.ids.shape[1]), compressors=_codecs())
    group.create_array("score_lo", data=plan.score_lo, compressors=_codecs())
    group.create_array("score_hi", data=plan.score_hi, compressors=_codecs())


def load_plan(path: Path) -> tuple[WindowPlan, dict]:
    group = zarr.open_group(str(path), mode="r")
    attrs = group.attrs.asdict()
    plan = WindowPlan(group["ids"][:], group["score_lo"][:], group["score_hi"][:], attrs["available_windows"])
    return plan, attrs
