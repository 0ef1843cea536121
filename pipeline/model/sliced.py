"""A layer larger than its device over the whole corpus, its routed experts read once per pass:
slices outside, chunks inside.

    stage(x, ids)           per chunk: the layer up to its MoE and the routing -> `staged`
    load_slice(a)           the experts of the slice from a, dequantized once
    add_slice(staged, acc)  per chunk: that slice's experts added into the float32 accumulator
    finish(x, staged, acc, ids)  per chunk: the layer's output, the held layer's

The layer's forward is the family's straight-line graph, so it is run whole both times, its MoE
standing in: at staging the MoE stops the forward once it has routed its input (through its own
`route`, with what the layer hands it: the token ids of a hash-routed layer, the stream of
Gemma 4's router); at the finish it returns the shared expert plus the accumulated experts.
What the layer's other blocks (attention, mixers) returned before the MoE is kept in `staged`
and given back at the finish instead of being computed again; what runs between them (norms,
residual sums) is computed again, the same operations on the same values, so the output is the
held layer's bit for bit.

`staged` packs, per token, the MoE's input, the routing weights, the chosen experts and those
blocks' outputs (tensors, or tuples of them, each with a token axis), [B, T, width] float32
(every value exact: the MoE's input and the outputs are in the compute dtype or float32, the
weights float32, the expert indices below 2^24), so the caller can store it between passes.
The widths come from the family: the layer's input is its boundary (a family of
hyper-connections carries several streams), the accumulator the experts' width. The experts
are summed in the held layer's order (by index, then the shared expert). Knows neither Luigi
nor Zarr.
"""
import contextlib
import functools
import math
from dataclasses import dataclass

import torch
from torch import nn

from .arch.experts import SlicedExperts
from .arch.family import DecoderArch
from .arch.ffn import MoE, Routed
from .executor import WindowExecutor


class Staged(Exception):
    """Raised by the MoE at staging: its input [B, T, hidden] and the routing of its tokens."""

    def __init__(self, u: torch.Tensor, routed: Routed):
        super().__init__("staged")
        self.u, self.routed = u, routed


@dataclass(frozen=True)
class Leaf:
    """One tensor of a kept output: where its token axis is, its other dims after it, its dtype."""
    axis: int
    rest: tuple[int, ...]
    dtype: torch.dtype

    @property
    def width(self) -> int:
        return math.prod(self.rest)

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        # t [B, ..., T, ...] -> [B, T, width] float32
        moved = t.movedim(self.axis, 1)
        return moved.reshape(*moved.shape[:2], -1).float()

    def unpack(self, packed: torch.Tensor) -> torch.Tensor:
        # packed [B, T, width] -> the tensor as the block returned it
        return packed.reshape(*packed.shape[:2], *self.rest).movedim(1, self.axis).to(self.dtype)


def leaves(out) -> list:
    """The tensors (or None) of a block's output, a tensor or nested tuples, in order."""
    if isinstance(out, (tuple, list)):
        return [leaf for o in out for leaf in leaves(o)]
    return [out]


def rebuilt(like, it):
    """`like`'s structure with its leaves taken in order from the iterator `it`."""
    if isinstance(like, (tuple, list)):
        return type(like)(rebuilt(o, it) for o in like)
    return next(it)


class SlicedLayer:
    def __init__(self, arch: DecoderArch, i: int, device: str, dtype: torch.dtype, expert_slices: int):
        self.arch, self.index = arch, i
        self.window = WindowExecutor(arch, i, i + 1, device, dtype, expert_slices)
        self.layer = self.window.layers.all()[0]
        blocks = list(self.layer.children())
        moe = [b for b in blocks if isinstance(b, MoE) and isinstance(b.experts, SlicedExperts)]
        if len(moe) != 1:
            raise RuntimeError(f"layer {i} of {arch.gguf.architecture} has no mixture of experts among its blocks "
                               f"to run in slices (a family that nests it says sliceable_experts = False)")
        self.moe: MoE = moe[0]
        self.others = [b for b in blocks if b is not self.moe]      # their outputs before the MoE are kept
        self.k = self.moe.routing.n_used
        self.slice = None

    @functools.cached_property
    def kept(self) -> list[tuple[int, object, list[Leaf | None]]]:
        """(block of `others`, the structure of its output, its leaves) of each output kept at
        staging, in the order the forward makes them: the same for any input, read off one
        sequence at two lengths (the token axis of a leaf is the one whose size follows)."""
        calls = [self.probe(T) for T in (5, 6)]
        kept = []
        for (j, out), (_, longer) in zip(*calls):
            kept_leaves = []
            for a, b in zip(leaves(out), leaves(longer)):
                if a is None:
                    kept_leaves.append(None)
                    continue
                axes = [d for d in range(1, a.dim()) if a.shape[d] != b.shape[d]]
                if len(axes) != 1:
                    raise RuntimeError(f"layer {self.index}: a block's output {list(a.shape)} has no one token axis "
                                       f"to keep between the slices")
                rest = a.shape[1:axes[0]] + a.shape[axes[0] + 1:]
                kept_leaves.append(Leaf(axes[0], tuple(rest), a.dtype))
            kept.append((j, out, kept_leaves))
        return kept

    @torch.inference_mode()
    def probe(self, T: int) -> list[tuple[int, object]]:
        """The kept outputs of the forward up to the MoE over one sequence of T zeros."""
        device, dtype = self.window.device, self.window.dtype
        x = torch.zeros(1, T, self.arch.boundary_width(self.index), device=device, dtype=dtype)
        _, outputs = self.staged_forward(x, torch.zeros(1, T, dtype=torch.long))
        return outputs

    @property
    def hidden(self) -> int:
        """The experts' input and output width (the accumulator's): the MoE's, or the latent width of
        experts between projections of the layer's own."""
        return self.moe.experts.down.shape[1]

    @property
    def width(self) -> int:
        """Values per token of `staged`."""
        return self.hidden + 2 * self.k + sum(leaf.width for _, _, kept in self.kept for leaf in kept if leaf)

    def call(self, x: torch.Tensor, ids: torch.Tensor | None, layout: torch.Tensor | None) -> torch.Tensor:
        """The layer's forward over x [B, T, boundary width] (packed rows' layout [B, T, fields] or
        None), as the window executor calls it."""
        inputs = self.window.token_inputs
        extra = () if inputs is None else (inputs(ids).get(self.index),)
        return self.layer(x, self.window.tables(x.shape[1], layout), None, *extra)

    def staged_forward(self, h: torch.Tensor, ids: torch.Tensor | None,
                       layout: torch.Tensor | None = None) -> tuple[Staged, list[tuple[int, object]]]:
        """The forward up to the MoE's routing: (what the MoE raised, (block, output) of each kept)."""
        outputs: list[tuple[int, object]] = []

        def keep(j):
            def hook(module, args, out):
                outputs.append((j, out))
            return hook

        def stop(u, *inputs):
            raise Staged(u, self.moe.route(u.reshape(-1, u.shape[-1]), *inputs))

        hooks = [b.register_forward_hook(keep(j)) for j, b in enumerate(self.others)]
        try:
            with replaced(self.moe, stop):
                self.call(h, ids, layout)
        except Staged as staged:
            return staged, outputs
        finally:
            for hook in hooks:
                hook.remove()
        raise RuntimeError(f"layer {self.index} never reached its experts")

    @torch.inference_mode()
    def stage(self, x: torch.Tensor, ids: torch.Tensor | None = None,
              layout: torch.Tensor | None = None) -> torch.Tensor:
        # x [B, T, boundary width] float32, ids [B, T], layout [B, T, fields] -> staged [B, T, width]
        # float32 on the CPU
        B, T, _ = x.shape
        staged, outputs = self.staged_forward(x.to(self.window.device, self.window.dtype), ids, layout)
        routed = staged.routed
        parts = [staged.u.float().reshape(B, T, -1), routed.weights.float().view(B, T, self.k),
                 routed.experts.float().view(B, T, self.k)]
        for (_, out), (_, _, kept_leaves) in zip(outputs, self.kept):
            parts += [leaf.pack(t) for t, leaf in zip(leaves(out), kept_leaves) if leaf is not None]
        return torch.cat(parts, -1).cpu()

    def load_slice(self, a: int) -> None:
        self.slice = self.moe.experts.load(a)

    @torch.inference_mode()
    def add_slice(self, staged: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:
        # staged [B, T, width], acc [B, T, hidden] float32 -> acc with the loaded slice's experts added
        u, routed = self.unpack(staged)
        out = acc.to(self.window.device).reshape(-1, acc.shape[-1])                # [N, hidden]
        self.moe.add_experts(u, routed, out, [self.slice])
        return out.view_as(acc).cpu()

    @torch.inference_mode()
    def finish(self, x: torch.Tensor, staged: torch.Tensor, acc: torch.Tensor,
               ids: torch.Tensor | None = None, layout: torch.Tensor | None = None) -> torch.Tensor:
        # x [B, T, boundary width] the layer's input -> [B, T, the next boundary's width] float32 on the
        # CPU, the held layer's output
        B, T, H = acc.shape
        device = self.window.device
        at = H + 2 * self.k
        kept: dict[int, list] = {j: [] for j in range(len(self.others))}
        for j, like, kept_leaves in self.kept:
            unpacked = []
            for leaf in kept_leaves:
                if leaf is None:
                    unpacked.append(None)
                    continue
                unpacked.append(leaf.unpack(staged[..., at:at + leaf.width].to(device)))
                at += leaf.width
            kept[j].append(rebuilt(like, iter(unpacked)))
        summed = acc.to(device).reshape(-1, H)
        moe_done = []

        def given(j, block):
            def forward(*args, **kwargs):
                return kept[j].pop(0) if not moe_done else type(block).forward(block, *args, **kwargs)
            return forward

        def experts(u, *inputs):
            moe_done.append(True)
            return self.moe.finish(u.reshape(-1, H), summed).view_as(u)

        with contextlib.ExitStack() as stack:
            stack.enter_context(replaced(self.moe, experts))
            for j, b in enumerate(self.others):
                stack.enter_context(replaced(b, given(j, b)))
            out = self.call(x.to(device, self.window.dtype), ids, layout)
        return out.to("cpu", torch.float32)

    def unpack(self, staged: torch.Tensor) -> tuple[torch.Tensor, Routed]:
        """The MoE's input [N, hidden] in the compute dtype and the routing of its tokens."""
        H = self.hidden
        flat = staged.reshape(-1, staged.shape[-1]).to(self.window.device)
        weights, experts = flat[:, H:H + self.k], flat[:, H + self.k:H + 2 * self.k].long()
        return flat[:, :H].to(self.window.dtype), Routed.of(weights, experts, self.moe.experts.n_experts)

    @property
    def weight_bytes(self) -> int:
        return self.window.weight_bytes

    def loading(self) -> dict:
        return self.window.loading()

    def release(self) -> None:
        self.slice = None
        self.window.release()


class replaced:
    """`module`'s forward replaced by `forward` inside the block (the module's own afterwards)."""

    def __init__(self, module: nn.Module, forward):
        self.module, self.forward = module, forward

    def __enter__(self):
        self.module.forward = self.forward

    def __exit__(self, *exc):
        del self.module.forward
