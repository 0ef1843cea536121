"""Layer-window executor: load layers [first, last) on a device, map hidden -> hidden, release.

Knows neither Luigi nor Zarr: it takes and returns float32 CPU tensors of shape
[B, T, boundary width] (the hidden state, and what the family carries
beside it) so the caller can store them wherever it likes. Each of the B rows is one
sequence: recurrent layers start every row from a zero state, so nothing crosses a
sequence or a layer cut. The weights of the window are one block (weight_block.py),
which on the CPU a released window leaves to the next; its layers are loaded into it by a thread
while the first chunk computes with those already loaded (layer_loading.py).
"""
import torch

from ..gguf_io.dequant import plan_host_load
from .arch.blocks import module_bytes
from .arch.family import DecoderArch
from .arch.modules import Tables
from .layer_loading import LayersLoading
from .weight_block import WeightBlock


class WindowExecutor:
    def __init__(self, arch: DecoderArch, first: int, last: int, device: str, dtype: torch.dtype,
                 expert_slices: int = 1):
        if not 0 <= first < last <= arch.hp.n_layers:
            raise ValueError(f"layer window [{first}, {last}) outside [0, {arch.hp.n_layers})")
        self.first, self.last, self.device, self.dtype = first, last, torch.device(device), dtype
        self.architecture, self.packs = arch.gguf.architecture, arch.packs_sequences
        if self.device.type == "cpu":   # a pass's windows, one after another, in this process
            plan_host_load(sum(t.n_bytes for i in range(arch.hp.n_layers) for t in arch.gguf.layer_tensors(i)))
        # > 1: each MoE layer's routed experts are read in this many slices while it runs
        self.weights = WeightBlock.for_layers(arch, first, last, dtype, self.device, expert_slices)
        self.token_inputs = arch.token_inputs(first, last, self.device, dtype)   # per-layer inputs from the ids
        # loaded by a thread while the first chunk computes with those already there (layer_loading.py)
        self.layers = LayersLoading(lambda i: arch.load_layer(i, self.device, dtype, self.weights, expert_slices),
                                    range(first, last), self.device)
        self._tables: dict[int, Tables] = {}

    @property
    def weight_bytes(self) -> int:
        return sum(module_bytes(m) for m in [*self.layers.all(), self.token_inputs] if m is not None)

    def loading(self) -> dict:
        """For the manifest: the seconds the layers took to load and, of them, those the computation
        waited for (the rest it hid)."""
        self.layers.all()   # the loader done, its time counted
        return {"weight_load_s": round(self.layers.load_s, 3), "weight_load_waited_s": round(self.layers.waited_s, 3)}

    @torch.inference_mode()
    def __call__(self, hidden: torch.Tensor, state: dict | None = None,
                 ids: torch.Tensor | None = None, layout: torch.Tensor | None = None) -> torch.Tensor:
        # hidden: [B, T, boundary width] float32 -> [B, T, the next boundary's width], float32 on the CPU.
        # state: recurrent state to start from and leave behind, per layer (None: zero per row);
        # ids: the token ids [B, T], for a family whose layers take inputs from them;
        # layout: [B, T, LAYOUT_FIELDS] of packed rows (SequencePlan.layout), None: a sequence a row
        tables = self.tables(hidden.shape[1], layout)
        inputs = None if self.token_inputs is None else self.token_inputs(ids)   # {layer: [B, T, width]}
        x = hidden.to(self.device, self.dtype)
        for k in range(len(self.layers)):
            i, layer = self.first + k, self.layers[k]
            args = (x, tables, None if state is None else state.setdefault(i, {}))
            x = layer(*args) if inputs is None else layer(*args, inputs.get(i))
        return x.to("cpu", torch.float32)

    def tables(self, T: int, layout: torch.Tensor | None = None) -> Tables:
        """RoPE tables, masks and temperatures for rows of T tokens: built once per length for rows
        of one sequence, per chunk for packed rows (their layout)."""
        if layout is not None:
            if not self.packs:
                raise ValueError(f"the {self.architecture} family does not compute packed rows")
            return Tables(T, self.device, self.dtype, layout.to(self.device))
        return self._tables.setdefault(T, Tables(T, self.device, self.dtype))

    def release(self) -> None:
        self.layers.finish()
        self.layers = None
        self.token_inputs = None
        self._tables.clear()
        self.weights.keep()
        self.weights = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
