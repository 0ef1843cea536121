"""Where a mixture-of-experts layer's routed experts come from.

Held: dequantized with the rest of the window. In slices, for a layer larger than its device:
experts [a, b) are dequantized into one scratch space, run on the tokens routed to them, then
overwritten by the next slice. A window task runs each slice over every chunk of the corpus
before the next (model/sliced.py), so each expert is read once per pass; called on one batch
(`slices`), a slice none of whose experts has a token is never read. Either way the experts run
one at a time in index order and their outputs are summed in the same order, so a sliced layer
gives the held layer's numbers bit for bit.
"""
import functools
import math

import torch
from gguf import MODEL_TENSOR as MT
from gguf import TENSOR_NAMES

from ...gguf_io.dequant import dequantize
from ...gguf_io.reader import GGUFIndex
from ..llama_cpp_numerics import as_read
from ..weight_block import WeightBlock
from .blocks import Weights

# the routed experts' tensors, [n_experts, rows, cols] each
EXPERT_TENSORS = {"gate_up": MT.FFN_GATE_UP_EXP, "up": MT.FFN_UP_EXP, "gate": MT.FFN_GATE_EXP, "down": MT.FFN_DOWN_EXP}


def split_gate_up(gate_up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A fused [E, 2 ff, hidden] gate-and-up tensor (the converter's --fuse-gate-up-exps) -> gate
    and up, [E, ff, hidden] each: the gate's rows come first."""
    gate, up = gate_up.chunk(2, dim=1)
    return gate, up


def expert_tensor_names(gguf: GGUFIndex, i: int) -> dict[str, str]:
    """Role ("gate_up", "up", "gate", "down") -> name of each routed-expert tensor block `i` has."""
    names = {role: TENSOR_NAMES[kind].format(bid=i) + ".weight" for role, kind in EXPERT_TENSORS.items()}
    return {role: name for role, name in names.items() if name in gguf.tensors}


def slice_firsts(n_experts: int, n_slices: int) -> range:
    """The first expert of each of the (at most) n_slices slices of equal count."""
    return range(0, n_experts, math.ceil(n_experts / n_slices))


class HeldExperts(Weights):
    """Every expert of the layer, dequantized with the window: [E, ff, hidden] up and gate,
    [E, hidden, ff] down."""

    def __init__(self, up: torch.Tensor, down: torch.Tensor, gate: torch.Tensor | None):
        super().__init__({"up": up, "down": down, "gate": gate})
        self.n_experts = up.shape[0]

    def slices(self, counts: list[int]):
        """(first expert, up, down, gate) of each slice: here the one slice of all of them."""
        yield 0, self.up, self.down, self.gate


class SlicedExperts(Weights):
    """The experts in `n_slices` slices of equal count, dequantized one slice at a time into
    scratch tensors (taken from the window's block) that every slice reuses."""

    def __init__(self, gguf: GGUFIndex, names: dict[str, str], n_slices: int, device, dtype: torch.dtype,
                 weights: WeightBlock | None, held_dtype):
        self.gguf, self.names, self.device = gguf, names, device
        self.n_experts = gguf.tensors[names["down"]].shape[0]
        self.firsts = slice_firsts(self.n_experts, n_slices)
        self.per_slice = self.firsts.step
        scratch = {}
        for role, name in names.items():
            shape, dt = (self.per_slice, *gguf.tensors[name].shape[1:]), held_dtype(name, dtype)
            view = weights.take(shape, dt) if weights is not None else None
            scratch[role] = view if view is not None else torch.empty(shape, dtype=dt, device=device)
        super().__init__(scratch)

    def describe(self) -> str:
        return f"{self.n_experts} experts in slices of {self.per_slice}"

    def slices(self, counts: list[int]):
        """(first expert, up, down, gate) of each slice holding an expert with tokens."""
        for a in self.firsts:
            if any(counts[a:a + self.per_slice]):
                yield self.load(a)

    def load(self, a: int) -> tuple:
        """(a, up, down, gate) of the slice of experts from a, dequantized into the scratch tensors."""
        b = min(a + self.per_slice, self.n_experts)
        loaded = {}
        for role, name in self.names.items():
            info, out, raw = self.gguf.tensors[name], self.w[role][:b - a], self.gguf.raw(name)[a:b]
            loaded[role] = as_read(dequantize(raw, info.qtype, self.device, name, out.dtype, out=out), raw, info.qtype)
            self.gguf.identity.seen(name, raw, first=a, then=functools.partial(self.gguf.release_pages, name))
        if "gate_up" in loaded:
            loaded["gate"], loaded["up"] = split_gate_up(loaded.pop("gate_up"))
        return a, loaded["up"], loaded["down"], loaded.get("gate")
