"""A layer larger than its device over the whole corpus, its routed experts read once per pass:
slices outside, chunks inside.

    stage(x)            per chunk: the layer up to its MoE and the routing -> `staged`
    load_slice(a)       the experts of the slice from a, dequantized once
    add_slice(staged, acc)  per chunk: that slice's experts added into the float32 accumulator
    finish(x, staged, acc)  per chunk: the layer's output, the held layer's

The layer's forward is the family's straight-line graph, so it is run whole both times, its MoE
standing in: at staging the MoE stops the forward once it has routed its input; at the finish
it returns the shared expert plus the accumulated experts. What the layer's other blocks
(attention, mixers) returned before the MoE is kept in `staged` and given back at the finish
instead of being computed again; what runs between them (norms, residual sums) is computed
again, the same operations on the same values, so the output is the held layer's bit for bit.

`staged` packs, per token, the MoE's input, the routing weights, the chosen experts and those
blocks' outputs, [B, T, width] float32 (every value exact: the MoE's input and the outputs are in
the compute dtype, the weights float32, the expert indices below 2^24), so the caller can store
it between passes. The experts are summed in the held layer's order (by index, then the shared
expert). Knows neither Luigi nor Zarr.
"""
import contextlib
import functools

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


class SlicedLayer:
    def __init__(self, arch: DecoderArch, i: int, device: str, dtype: torch.dtype, expert_slices: int):
        self.window = WindowExecutor(arch, i, i + 1, device, dtype, expert_slices)
        self.layer = self.window.layers[0]
        blocks = list(self.layer.children())
        self.moe: MoE = next(b for b in blocks if isinstance(b, MoE) and isinstance(b.experts, SlicedExperts))
        self.others = [b for b in blocks if b is not self.moe]      # their outputs before the MoE are kept
        self.k = self.moe.routing.n_used
        self.slice = None

    @functools.cached_property
    def kept(self) -> list[tuple[int, int]]:
        """(block of `others`, width) of each output kept at staging, in the order the forward
        makes them: the same for any input, read off one token."""
        calls: list[tuple[int, int]] = []
        x = torch.zeros(1, 1, self.hidden, device=self.window.device, dtype=self.window.dtype)
        self.staged_forward(x, calls)
        return calls

    @property
    def hidden(self) -> int:
        return self.moe.router.shape[1]

    @property
    def width(self) -> int:
        """Values per token of `staged`."""
        return self.hidden + 2 * self.k + sum(w for _, w in self.kept)

    def staged_forward(self, h: torch.Tensor, calls: list | None = None) -> tuple[Staged, list[torch.Tensor]]:
        """The forward up to the MoE's routing: (what the MoE raised, the outputs kept)."""
        outputs: list[torch.Tensor] = []

        def keep(j):
            def hook(module, args, out):
                outputs.append(out)
                if calls is not None:
                    calls.append((j, out.shape[-1]))
            return hook

        def stop(u, *args, **kwargs):
            raise Staged(u, self.moe.route(u.reshape(-1, u.shape[-1])))

        hooks = [b.register_forward_hook(keep(j)) for j, b in enumerate(self.others)]
        try:
            with replaced(self.moe, stop):
                self.layer(h, self.window.tables(h.shape[1]), None)
        except Staged as staged:
            return staged, outputs
        finally:
            for hook in hooks:
                hook.remove()
        raise RuntimeError(f"layer {self.layer.spec.index} never reached its experts")

    @torch.inference_mode()
    def stage(self, x: torch.Tensor) -> torch.Tensor:
        # x [B, T, hidden] float32 -> staged [B, T, width] float32 on the CPU
        B, T, _ = x.shape
        staged, outputs = self.staged_forward(x.to(self.window.device, self.window.dtype))
        routed = staged.routed
        parts = [staged.u.float(), routed.weights.float().view(B, T, self.k), routed.experts.float().view(B, T, self.k),
                 *(out.float().reshape(B, T, -1) for out in outputs)]
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
    def finish(self, x: torch.Tensor, staged: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:
        # x [B, T, hidden] the layer's input -> hidden [B, T, hidden] float32 on the CPU, the held layer's output
        B, T, H = acc.shape
        device, dtype = self.window.device, self.window.dtype
        at = H + 2 * self.k
        kept: dict[int, list[torch.Tensor]] = {j: [] for j in range(len(self.others))}
        for j, w in self.kept:
            kept[j].append(staged[..., at:at + w].to(device, dtype))
            at += w
        summed = acc.to(device).reshape(-1, H)
        moe_done = []

        def given(j, block):
            def forward(*args, **kwargs):
                return kept[j].pop(0) if not moe_done else type(block).forward(block, *args, **kwargs)
            return forward

        def experts(u, *args, **kwargs):
            moe_done.append(True)
            return self.moe.finish(u.reshape(-1, H), summed).view_as(u)

        with contextlib.ExitStack() as stack:
            stack.enter_context(replaced(self.moe, experts))
            for j, b in enumerate(self.others):
                stack.enter_context(replaced(b, given(j, b)))
            out = self.layer(x.to(device, dtype), self.window.tables(T), None)
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
