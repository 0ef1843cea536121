"""GGML tensor types by number: gguf-py's enum, and the types ggml defines that the installed
gguf-py may not know yet, with the block sizes of all of them.

A type gguf-py's enum lacks gets a member of `NewerType` (same number, same name), which hashes
and compares as its number, as gguf-py's members do: a table keyed by either finds the other.
"""
from enum import IntEnum

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType


class NewerType(IntEnum):
    """ggml.h's numbers of the types newer than some gguf-py releases."""
    Q1_0 = 41   # 128 signs and one scale: +d or -d
    Q2_0 = 42   # 64 2-bit codes and one scale: (code - 1) * d


GGMLType = GGMLQuantizationType | NewerType

# (values per block, bytes per block): one float16 scale, then the packed codes
NEWER_SIZES = {NewerType.Q1_0: (128, 2 + 128 // 8), NewerType.Q2_0: (64, 2 + 64 // 4)}


def ggml_type(number: int) -> GGMLType:
    """gguf-py's member for a type number where it has one, else ours; ValueError for a number
    neither knows."""
    try:
        return GGMLQuantizationType(number)
    except ValueError:
        return NewerType(number)


def type_named(name: str) -> GGMLType:
    """The type called `name` (`Q4_K`, `Q1_0`); KeyError for a name neither knows."""
    member = GGMLQuantizationType.__members__.get(name) or NewerType.__members__.get(name)
    if member is None:
        raise KeyError(name)
    return ggml_type(member)


def _sizes() -> dict:
    for qtype, size in NEWER_SIZES.items():   # a gguf-py that knows a type must agree with ggml on it
        assert GGML_QUANT_SIZES.get(qtype, size) == size, (qtype.name, GGML_QUANT_SIZES[qtype], size)
    return {**{ggml_type(q): size for q, size in NEWER_SIZES.items()}, **GGML_QUANT_SIZES}


QUANT_SIZES: dict[GGMLType, tuple[int, int]] = _sizes()
Q1_0, Q2_0 = ggml_type(NewerType.Q1_0), ggml_type(NewerType.Q2_0)
