"""A layer larger than its device over the whole corpus, its routed experts read once per pass:
slices outside, chunks inside.

    stage(x)            per chunk: the layer up to its MoE and the routing -> `staged`
    load_slice(a)       the experts of the slice from a, dequantized once
    add_slice(staged, acc)  per chunk: that slice's experts added into the float32 accumulator
    finish(staged, acc) per chunk: the shared expert, the residual and the rest of the layer

`staged` packs, per token, the residual stream, the MoE's input, the routing weights and the
chosen experts, [B, T, 2 hidden + 2 k] float32 (every value exact: the first two are in the
compute dtype, the weights float32, the expert indices below 2^24), so the caller can store it
between passes. The experts are summed in the held layer's order (by index, then the shared
expert), so the output is the held layer's bit for bit. Knows neither Luigi nor Zarr.
"""
import torch

from .arch.base import DecoderArch
from .arch.experts import SlicedExperts
from .arch.ffn import MoE, Routed
from .executor import WindowExecutor


class SlicedLayer:
    def __init__(self, arch: DecoderArch, i: int, device: str, dtype: torch.dtype, expert_slices: int):
        self.window = WindowExecutor(arch, i, i + 1, device, dtype, expert_slices)
        steps = list(self.window.layers[0].steps)
        m = next(j for j, s in enumerate(steps) if isinstance(s.op, MoE) and isinstance(s.op.experts, SlicedExperts))
        self.before, self.step, self.after = steps[:m], steps[m], steps[m + 1:]
        self.moe: MoE = self.step.op
        self.k = self.moe.routing.n_used
        self.slice = None

    @torch.inference_mode()
    def stage(self, x: torch.Tensor) -> torch.Tensor:
        # x [B, T, hidden] float32 -> staged [B, T, 2 hidden + 2 k] float32 on the CPU
        B, T, H = x.shape
        tables = self.window.tables(T)
        h = x.to(self.window.device, self.window.dtype)
        for step in self.before:
            h = step(h, tables, None)
        u = self.step.op_input(h)                                                   # [B, T, hidden]
        routed = self.moe.route(u.reshape(-1, H))
        parts = [h.float(), u.float(), routed.weights.float().view(B, T, self.k),
                 routed.experts.float().view(B, T, self.k)]
        return torch.cat(parts, -1).cpu()

    def load_slice(self, a: int) -> None:
        self.slice = self.moe.experts.load(a)

    @torch.inference_mode()
    def add_slice(self, staged: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:
        # staged [B, T, 2 hidden + 2 k], acc [B, T, hidden] float32 -> acc with the loaded slice's experts added
        u, routed = self.unpack(staged)
        out = acc.to(self.window.device).reshape(-1, acc.shape[-1])                # [N, hidden]
        self.moe.add_experts(u, routed, out, [self.slice])
        return out.view_as(acc).cpu()

    @torch.inference_mode()
    def finish(self, staged: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:
        # -> hidden [B, T, hidden] float32 on the CPU, the held layer's output
        B, T, H = acc.shape
        h = staged[..., :H].to(self.window.device, self.window.dtype)
        u, _ = self.unpack(staged)
        y = self.moe.finish(u, acc.to(self.window.device).reshape(-1, H)).view(B, T, H)
        h = self.step.add(h, y)
        tables = self.window.tables(T)
        for step in self.after:
            h = step(h, tables, None)
        return h.to("cpu", torch.float32)

    def unpack(self, staged: torch.Tensor) -> tuple[torch.Tensor, Routed]:
        """The MoE's input [N, hidden] in the compute dtype and the routing of its tokens."""
        H = (staged.shape[-1] - 2 * self.k) // 2
        flat = staged.reshape(-1, staged.shape[-1]).to(self.window.device)
        weights, experts = flat[:, 2 * H:2 * H + self.k], flat[:, 2 * H + self.k:].long()
        return flat[:, H:2 * H].to(self.window.dtype), Routed.of(weights, experts, self.moe.experts.n_experts)

    @property
    def weight_bytes(self) -> int:
        return self.window.weight_bytes

    def release(self) -> None:
        self.slice = None
        self.window.release()
