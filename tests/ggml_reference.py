"""ggml's own quantize and dequantize functions, called through ctypes from the libggml-base.so of
the llama.cpp build that llama-perplexity comes from (pipeline/tools/llamacpp.py builds it), and
what they are used for: the reference blocks of Q1_0 and Q2_0 in tests/data, and Q1_0 and Q2_0
versions of a model for a comparison with llama-perplexity.

`python -m tests.ggml_reference` writes tests/data/ggml-q1_0-q2_0.npz anew;
`python -m tests.ggml_reference quantize SRC DST TYPE [--float32]` writes SRC with its layer
matrices in TYPE (with --float32, every tensor then as its float32 values).
"""
import ctypes
import dataclasses
import functools
import sys
from pathlib import Path

import numpy as np

from pipeline.gguf_io.ggml_types import Q1_0, Q2_0, QUANT_SIZES, GGMLType
from pipeline.tools.llamacpp import cache_dir, ggml_cpu_library

from .helpers import REFERENCE

LLAMA_CPP_PYTHON = "0.3.36"
LIBRARY = cache_dir() / f"llama-cpp-python-{LLAMA_CPP_PYTHON}" / "build-native-noamx" / "bin" / "libggml-base.so"
STORED = REFERENCE / "ggml-q1_0-q2_0.npz"
NEW_TYPES = (Q1_0, Q2_0)

# float16 scales: zeros, normal values of both signs, subnormals, the largest, infinities, and
# NaNs quiet and signalling with payloads, positive and negative
SCALES = (0x0000, 0x8000, 0x3C00, 0xBC00, 0x2E66, 0xC8D2, 0x0001, 0x03FF, 0x8001, 0x83FF, 0x0400, 0x7BFF,
          0xFBFF, 0x7C00, 0xFC00, 0x7E00, 0xFE00, 0x7C01, 0xFC01, 0x7D55, 0x7FFF)
# code bytes: all clear, all set, alternating, every 2-bit code in each position (0xE4: codes
# 0, 1, 2, 3; 0x1B: 3, 2, 1, 0), a single bit
PATTERNS = (0x00, 0xFF, 0x55, 0xAA, 0xE4, 0x1B, 0x01, 0x80)


class TypeTraits(ctypes.Structure):
    """ggml.h's struct ggml_type_traits."""
    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64),
                ("blck_size_interleave", ctypes.c_int64), ("type_size", ctypes.c_size_t),
                ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p), ("from_float_ref", ctypes.c_void_p)]


TO_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)


@functools.cache
def ggml() -> ctypes.CDLL:
    ggml_cpu_library(LLAMA_CPP_PYTHON)   # built, with libggml-base.so beside it, where it is missing
    lib = ctypes.CDLL(str(LIBRARY))
    lib.ggml_get_type_traits.restype = ctypes.POINTER(TypeTraits)
    lib.ggml_get_type_traits.argtypes = [ctypes.c_int]
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    return lib


def traits(qtype: GGMLType) -> TypeTraits:
    return ggml().ggml_get_type_traits(int(qtype)).contents


def ggml_dequantize(blocks: np.ndarray, qtype: GGMLType) -> np.ndarray:
    """uint8 blocks [n, type_size] -> float32 [n, block] by ggml's to_float (dequantize_row_*)."""
    block, type_size = QUANT_SIZES[qtype]
    assert blocks.shape[1] == type_size, blocks.shape
    source = np.ascontiguousarray(blocks, dtype=np.uint8)
    out = np.empty((blocks.shape[0], block), dtype=np.float32)
    TO_FLOAT(traits(qtype).to_float)(source.ctypes.data, out.ctypes.data, out.size)
    return out


def ggml_quantize(values: np.ndarray, qtype: GGMLType) -> np.ndarray:
    """float32 rows [rows, n_per_row] -> uint8 [rows, row_bytes] by ggml_quantize_chunk (no
    importance matrix: quantize_row_*_ref for these types)."""
    block, type_size = QUANT_SIZES[qtype]
    source = np.ascontiguousarray(values, dtype=np.float32)
    rows, n_per_row = source.shape
    out = np.empty((rows, n_per_row // block * type_size), dtype=np.uint8)
    written = ggml().ggml_quantize_chunk(int(qtype), source.ctypes.data, out.ctypes.data, 0, rows, n_per_row, None)
    assert written == out.nbytes, (written, out.nbytes)
    return out


def edge_blocks(qtype: GGMLType) -> np.ndarray:
    """uint8 [len(SCALES) * len(PATTERNS), type_size]: every scale with every code pattern."""
    _, type_size = QUANT_SIZES[qtype]
    scale, pattern = np.meshgrid(np.array(SCALES, np.uint16), np.array(PATTERNS, np.uint8), indexing="ij")
    blocks = np.empty((scale.size, type_size), dtype=np.uint8)
    blocks[:, :2] = scale.reshape(-1, 1).view(np.uint8)
    blocks[:, 2:] = pattern.reshape(-1, 1)
    return blocks


def quantized_blocks(qtype: GGMLType, seed: int) -> np.ndarray:
    """Blocks ggml's quantizer makes: of normal values, of rows with zeros, ties and outliers."""
    block, _ = QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    rows = rng.standard_normal((4, block)).astype(np.float32)
    rows[1, ::3] = 0.0
    rows[2] = np.resize(np.float32([1.0, -0.5, 0.5, -1.0, 1.5, 0.25]), block)   # round(w / amax) at ties
    rows[3, 7] = 1e4
    return ggml_quantize(rows, qtype).reshape(-1, QUANT_SIZES[qtype][1])


def reference_data() -> dict[str, np.ndarray]:
    """Per type NAME: NAME_blocks (edge cases, then ggml-quantized blocks) and NAME_values,
    ggml's float32 of them."""
    data = {}
    for qtype in NEW_TYPES:
        blocks = np.concatenate([edge_blocks(qtype), quantized_blocks(qtype, seed=int(qtype))])
        data[f"{qtype.name}_blocks"], data[f"{qtype.name}_values"] = blocks, ggml_dequantize(blocks, qtype)
    return data


def quantize_model(src: Path, dst: Path, qtype: GGMLType, as_float32: bool = False) -> dict[str, int]:
    """Copy the GGUF `src` to `dst` with every layer matrix (`blk.*`, 2-D, rows a multiple of the
    block) quantized to `qtype` by ggml from its float32 values, every other tensor as it is;
    `as_float32`: every tensor then written as F32, its values as the package dequantizes them
    (llama.cpp's products over that twin run in float32). Returns the count of tensors per type."""
    from gguf import GGMLQuantizationType

    from pipeline.gguf_io.dequant import dequantize

    def convert(name, info, raw, values):
        if name.startswith("blk.") and len(info.shape) == 2 and info.shape[-1] % QUANT_SIZES[qtype][0] == 0:
            raw, info = ggml_quantize(values(), qtype), dataclasses.replace(info, qtype=qtype)
        if as_float32:
            return dequantize(raw, info.qtype).numpy().view(np.uint8), GGMLQuantizationType.F32
        return raw, info.qtype
    return rewrite(src, dst, convert)


def rewrite(src: Path, dst: Path, convert) -> dict[str, int]:
    """Copy the GGUF `src` (of types gguf-py's reader knows: it reads the metadata entries with
    their types) to `dst`, metadata and tensor order kept, each tensor's bytes and type those
    convert(name, info, raw bytes, values()) returns: (uint8 [rows, row bytes], type). Returns the
    count of tensors per type written."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter, Keys

    from pipeline.gguf_io.dequant import dequantize
    from pipeline.gguf_io.reader import GGUFIndex

    index, reader = GGUFIndex(src), GGUFReader(str(src))
    writer = GGUFWriter(str(dst), index.architecture)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == Keys.General.ARCHITECTURE:
            continue
        sub = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), field.types[0], sub_type=sub)
    counts: dict[str, int] = {}
    for name, info in index.tensors.items():
        raw = index.raw(name)
        data, qtype = convert(name, info, raw, lambda: dequantize(raw, info.qtype).numpy())
        # as int8 with the shape in values: gguf-py's writer then takes the type number as it is
        writer.add_tensor(name, np.ascontiguousarray(data).view(np.int8), raw_shape=info.shape, raw_dtype=int(qtype))
        counts[qtype.name] = counts.get(qtype.name, 0) + 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return counts


def main(argv: list[str]) -> None:
    if argv[:1] == ["quantize"]:
        from pipeline.gguf_io.ggml_types import type_named

        print(quantize_model(Path(argv[1]), Path(argv[2]), type_named(argv[3]), as_float32=argv[4:] == ["--float32"]))
        return
    np.savez_compressed(STORED, **reference_data())
    print(f"wrote {STORED}")


if __name__ == "__main__":
    main(sys.argv[1:])
