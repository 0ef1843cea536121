"""How a layer's tensors come off the file: dequantized on the window's device in the dtype the
family holds them in, into the window's weight block, each named tensor read at most once and
every tensor of the block read or the file refused."""
import torch
from gguf import MODEL_TENSOR, TENSOR_NAMES

from ...errors import UserError
from ...gguf_io.dequant import dequantize
from ...gguf_io.reader import GGUFIndex
from ..llama_cpp_numerics import as_read
from ..weight_block import WeightBlock


def read_tensor(gguf: GGUFIndex, name: str, device, dtype, weights: WeightBlock | None = None) -> torch.Tensor:
    """A tensor of the file, dequantized on `device` and cast to `dtype`, inside `weights`
    where it is given and has room."""
    if name not in gguf.tensors:
        raise UserError(f"{gguf.path}: missing tensor {name}")
    info = gguf.tensors[name]
    out = weights.take(info.shape, dtype) if weights is not None else None
    raw = gguf.raw(name)
    t = as_read(dequantize(raw, info.qtype, device, name, dtype, out=out), raw, info.qtype)
    gguf.identity.seen(name, raw, then=lambda: gguf.release_pages(name))
    return t


class BlockTensors:
    """The tensors of block `i`, dequantized on request (into `weights` where given) in the dtype
    `held_dtype(name, dtype)` gives (the family's); remembers which it read."""

    def __init__(self, gguf: GGUFIndex, i: int, device, dtype, held_dtype, weights: WeightBlock | None = None,
                 expert_slices: int = 1):
        self.gguf, self.i, self.device, self.dtype, self.weights = gguf, i, device, dtype, weights
        self.held_dtype = held_dtype
        self.expert_slices = expert_slices   # > 1: the routed experts are read a slice at a time
        self.read = set()

    def name(self, kind: MODEL_TENSOR | str, suffix: str | None = "weight") -> str:
        """The file's name of a tensor of the block: `kind` a gguf-py tensor kind, or the name
        inside the block where gguf-py has none (a newer family's, as "indexer.q_proj")."""
        base = TENSOR_NAMES[kind].format(bid=self.i) if isinstance(kind, MODEL_TENSOR) else f"blk.{self.i}.{kind}"
        return f"{base}.{suffix}" if suffix else base

    def has(self, kind: MODEL_TENSOR, suffix: str | None = "weight") -> bool:
        return self.name(kind, suffix) in self.gguf.tensors

    def __call__(self, kind: MODEL_TENSOR, suffix: str | None = "weight", required: bool = True) -> torch.Tensor | None:
        name = self.name(kind, suffix)
        if name not in self.gguf.tensors and not required:
            return None
        t = self.dequantized(name, self.weights)
        self.read.add(name)
        return t

    def dequantized(self, name: str, weights: WeightBlock | None) -> torch.Tensor:
        return read_tensor(self.gguf, name, self.device, self.held_dtype(name, self.dtype), weights)

    def unheld(self, kind: MODEL_TENSOR, suffix: str = "weight") -> torch.Tensor:
        """A tensor dequantized outside the window's block, for one the layer turns into another
        at load (`keep` puts the result where the block has room for it)."""
        name = self.name(kind, suffix)
        self.read.add(name)
        return self.dequantized(name, None)

    def unused(self, *kinds: str) -> None:
        """Tensors of the block that the file may hold and llama.cpp loads, but that its graph does
        not use on this layer: taken as read, never dequantized."""
        self.read.update(name for name in map(self.name, kinds) if name in self.gguf.tensors)

    def keep(self, t: torch.Tensor) -> torch.Tensor:
        """`t` moved into the window's block where it has room (else as it is)."""
        view = self.weights.take(tuple(t.shape), t.dtype) if self.weights is not None else None
        return t if view is None else view.copy_(t)

    def check_all_read(self) -> None:
        """A tensor of the block that the layer did not read means a variant we would compute
        wrongly (merged or latent experts, extra projections): refuse it rather than guess."""
        unread = sorted(t.name for t in self.gguf.layer_tensors(self.i) if t.name not in self.read)
        if unread:
            raise UserError(f"{self.gguf.path}: tensor {unread[0]} is not part of the {self.gguf.architecture} "
                            f"layer layercycle computes; this variant of the architecture is not supported")


class ShapeTensors(BlockTensors):
    """The same requests answered with empty tensors on the meta device, of the shapes and dtypes
    a window would hold: a layer built from them shows what it computes without reading a byte."""

    def dequantized(self, name: str, weights: WeightBlock | None) -> torch.Tensor:
        if name not in self.gguf.tensors:
            raise UserError(f"{self.gguf.path}: missing tensor {name}")
        return torch.empty(self.gguf.tensors[name].shape, dtype=self.held_dtype(name, self.dtype), device="meta")
