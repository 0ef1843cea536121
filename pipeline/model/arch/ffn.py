"""Feed-forward blocks: the dense MLP (gated or not) and the mixture of experts."""
import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..llama_cpp_numerics import shared_input, shared_rows
from .blocks import Weights, wide

# llama.cpp clamps the sum of the chosen weights here before renormalising (smallest normal f16)
MIN_WEIGHT_SUM = 6.103515625e-5


def relu2(x: torch.Tensor) -> torch.Tensor:
    return F.relu(x).square()


def swiglu_oai(gate: torch.Tensor, up: torch.Tensor, alpha: float = 1.702, limit: float = 7.0) -> torch.Tensor:
    """gpt-oss's gated unit (llama.cpp's swiglu_oai, constants as its MoE graph fixes them): the gate
    clamped above at `limit`, the up projection clamped to +-limit and offset by 1."""
    gate = gate.clamp(max=limit)
    return gate * torch.sigmoid(alpha * gate) * (up.clamp(-limit, limit) + 1)


def swiglu_limited(gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor:
    """llama.cpp's SwiGLU under a limit (swiglu_clamp_exp / swiglu_clamp_shexp, Step-3.5's): silu(gate)
    clamped above at `limit`, times the up projection clamped to +-limit."""
    return F.silu(gate).clamp(max=limit) * up.clamp(-limit, limit)


def swiglu_clamp(gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor:
    """ggml's swiglu_clamp (DeepSeek-V4's): the gate clamped above at `limit` before the SiLU, the up
    projection to +-limit."""
    return F.silu(gate.clamp(max=limit)) * up.clamp(-limit, limit)


def feed_forward(x: torch.Tensor, up: torch.Tensor, down: torch.Tensor, gate: torch.Tensor | None, act,
                 up_bias: torch.Tensor | None = None, down_bias: torch.Tensor | None = None,
                 gate_bias: torch.Tensor | None = None, glu=None, linear=None) -> torch.Tensor:
    """down(act(gate x) * up x), down(glu(gate x, up x)) where a gated unit is given, or
    down(act(up x)) where there is no gate. The product is formed in place, so at most two
    [..., ffn] activations are alive at once. `linear`: the products of x, where the caller has
    them (an expert's rows of an input quantized once)."""
    linear = linear or shared_input(x, *(up,) if gate is None else (gate, up))
    if gate is None:
        return F.linear(act(linear(up, up_bias)), down, down_bias)
    if glu is not None:
        return F.linear(glu(linear(gate, gate_bias), linear(up, up_bias)), down, down_bias)
    h = act(linear(gate, gate_bias))   # [..., ffn]
    h.mul_(linear(up, up_bias))        # [..., ffn]
    return F.linear(h, down, down_bias)


class MLP(Weights):
    """down(act(gate x) * up x) (or the gated unit `glu`'s), or down(act(up x)) where there is no gate."""

    def __init__(self, up: torch.Tensor, down: torch.Tensor, gate: torch.Tensor | None, act,
                 up_bias: torch.Tensor | None = None, down_bias: torch.Tensor | None = None, glu=None):
        super().__init__({"up": up, "down": down, "gate": gate, "up_bias": up_bias, "down_bias": down_bias})
        self.act, self.glu = act, glu

    def describe(self) -> str:
        return f"act={_name(self.glu or self.act)}"

    def forward(self, x: torch.Tensor, tables=None, state=None) -> torch.Tensor:
        return feed_forward(x, self.up, self.down, self.gate, self.act, self.up_bias, self.down_bias, glu=self.glu)


@dataclass(frozen=True)
class Routing:
    n_used: int            # experts per token (top-k)
    gating: str            # "softmax", "sigmoid" or "sqrt_softplus" over the router logits;
                           # "softmax_weight": softmax over the chosen experts' logits (gpt-oss)
    normalize: bool        # chosen weights divided by their sum
    scale: float = 1.0     # chosen weights multiplied by it
    n_groups: int = 1      # experts in this many equal groups: the top-k is taken in the
    n_groups_used: int = 1  # groups whose two best experts score highest (DeepSeek-V3's group limit)


def expert_scores(logits: torch.Tensor, gating: str) -> torch.Tensor:
    """Router logits [N, E] -> the experts' scores, float32 or wider (softmax_weight: the logits,
    chosen on them and weighted by a softmax over the chosen)."""
    logits = wide(logits)
    if gating == "softmax":
        return logits.softmax(-1)
    if gating == "sigmoid":
        return logits.sigmoid()
    if gating == "sqrt_softplus":
        return F.softplus(logits).sqrt()
    return logits


def normalized(weights: torch.Tensor, routing: Routing) -> torch.Tensor:
    """The chosen experts' weights [N, k], divided by their sum where the routing says so, scaled."""
    if routing.normalize:
        weights = weights / weights.sum(-1, keepdim=True).clamp_min(MIN_WEIGHT_SUM)
    return weights * routing.scale if routing.scale != 1.0 else weights


def route(logits: torch.Tensor, routing: Routing, selection_bias: torch.Tensor | None = None):
    """logits [N, E] -> weights [N, k] (float32 or wider), experts [N, k].

    Experts are chosen on the (optionally biased) scores, weighted by the unbiased ones. Equal
    scores go to the lower expert index (a stable sort), so the choice never depends on the
    batch or the kernel.
    """
    probs = expert_scores(logits, routing.gating)
    select = probs if selection_bias is None else probs + selection_bias
    if routing.n_groups > 1:  # as llama.cpp's build_moe_ffn: the other groups' experts are never chosen
        N, E = select.shape
        grouped = select.view(N, routing.n_groups, E // routing.n_groups)                 # [N, G, E/G]
        group_scores = grouped.topk(2, dim=-1).values.sum(-1)                             # [N, G]
        kept = torch.sort(group_scores, dim=-1, descending=True, stable=True).indices[:, :routing.n_groups_used]
        dropped = torch.ones_like(group_scores, dtype=torch.bool).scatter_(1, kept, False)
        select = grouped.masked_fill(dropped[..., None], -math.inf).view(N, E)
    experts = torch.sort(select, dim=-1, descending=True, stable=True).indices[:, :routing.n_used]
    weights = probs.gather(-1, experts)
    if routing.gating == "softmax_weight":
        weights = weights.softmax(-1)
    return normalized(weights, routing), experts


def _name(fn) -> str:
    if isinstance(fn, functools.partial):   # a unit with its settings, as "swiglu_limited(limit=7)"
        return f"{_name(fn.func)}({', '.join(f'{k}={v:g}' for k, v in fn.keywords.items())})"
    return getattr(fn, "__name__", repr(fn))


class MoE(Weights):
    """Routed experts (+ an always-on shared expert, optionally gated by sigmoid(shared_gate . x)),
    with a router bias and per-expert biases [E, rows] where the family has them.

    The experts come from `experts` (experts.py: held with the window, or dequantized a slice at
    a time); each runs only on the tokens routed to it, so an expert that receives no token
    costs nothing.
    """

    def __init__(self, router: torch.Tensor, experts: nn.Module, act, routing: Routing,
                 selection_bias: torch.Tensor | None = None, shared: MLP | None = None,
                 shared_gate: torch.Tensor | None = None, router_bias: torch.Tensor | None = None,
                 expert_biases: dict[str, torch.Tensor] | None = None, glu=None, weight_before_experts: bool = False):
        biases = {f"{role}_bias": t for role, t in (expert_biases or {}).items()}   # up, gate, down: [E, rows]
        super().__init__({"router": router, "selection_bias": selection_bias, "shared_gate": shared_gate,
                          "router_bias": router_bias, "up_bias": None, "gate_bias": None, "down_bias": None, **biases})
        self.experts, self.act, self.routing, self.shared, self.glu = experts, act, routing, shared, glu
        self.weight_before_experts = weight_before_experts   # Llama 4: the routing weight scales the expert's input

    def describe(self) -> str:
        return f"act={_name(self.glu or self.act)}, {self.routing}"

    def expert_biases(self) -> dict[str, torch.Tensor]:
        """feed_forward's bias argument -> the experts' biases [E, rows], those the layer has."""
        return {name: b for name in ("up_bias", "gate_bias", "down_bias") if (b := getattr(self, name)) is not None}

    def forward(self, x: torch.Tensor, *inputs) -> torch.Tensor:
        # x: [B, T, hidden]; inputs: what the layer hands the block beside it (route reads them)
        flat = x.reshape(-1, x.shape[-1])                                     # [N, hidden]
        routed = self.route(flat, *inputs)
        out = torch.zeros(flat.shape, dtype=routed.weights.dtype, device=flat.device)  # summed in float32 or wider
        self.add_experts(flat, routed, out, self.experts.slices(routed.counts))
        return self.finish(flat, out).view_as(x)

    def route(self, flat: torch.Tensor, *inputs) -> "Routed":
        """The routing of the tokens flat [N, hidden], the experts' input; `inputs`, the layer's other
        arguments to the block, are read by a family whose router takes more (the token ids, the
        stream). The held layer and the sliced one (model/sliced.py) both route through here."""
        weights, experts = route(F.linear(wide(flat), self.router, self.router_bias), self.routing, self.selection_bias)
        return Routed.of(weights, experts, self.experts.n_experts)

    def add_experts(self, flat: torch.Tensor, routed: "Routed", out: torch.Tensor, slices) -> None:
        """Add into out [N, hidden] (float32 or wider) the output of the experts of `slices`
        ((first expert, up, down, gate) each), in expert order, each on its routed tokens."""
        k, biases = routed.experts.shape[1], self.expert_biases()
        for first, up, down, gate in slices:                                      # [n, ff, hidden] ...
            # in llama-cpp numerics the tokens' input quantized once for all experts, as ggml does
            rows = None if self.weight_before_experts else shared_rows(flat, *(up,) if gate is None else (gate, up))
            for j in range(up.shape[0]):
                e = first + j
                if not routed.counts[e]:
                    continue
                token, slot = routed.groups[e] // k, routed.groups[e] % k             # [n_e], [n_e]
                bias = {name: b[e] for name, b in biases.items()}
                w = routed.weights[token, slot, None]                                   # [n_e, 1]
                x_e = (flat[token] * w).to(flat.dtype) if self.weight_before_experts else flat[token]
                y = feed_forward(x_e, up[j], down[j], None if gate is None else gate[j], self.act,
                                 glu=self.glu, linear=rows and rows(token), **bias).to(out.dtype)  # [n_e, hidden]
                out.index_add_(0, token, y if self.weight_before_experts else y * w)

    def finish(self, flat: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The routed experts' sum out [N, hidden] with the shared expert added, in flat's dtype."""
        if self.shared is not None:
            s = self.shared(flat)
            if self.shared_gate is not None:
                s = s * torch.sigmoid(F.linear(flat, self.shared_gate.view(1, -1)))
            out = out + s
        return out.to(flat.dtype)


@dataclass(frozen=True)
class Routed:
    """Where the tokens go: weights [N, k] (float32 or wider) and experts [N, k] of each token,
    and the (token, slot) pairs grouped by expert, tokens ascending in each group (a stable
    sort); one count per expert is the only value that goes to the host."""
    weights: torch.Tensor
    experts: torch.Tensor
    counts: list[int]
    groups: tuple[torch.Tensor, ...]

    @classmethod
    def of(cls, weights: torch.Tensor, experts: torch.Tensor, n_experts: int) -> "Routed":
        pairs = torch.sort(experts.flatten(), stable=True).indices               # [N * k]
        counts = torch.bincount(experts.flatten(), minlength=n_experts).tolist()
        return cls(weights, experts, counts, pairs.split(counts))


class ScaledSumMoE(MoE):
    """Routed experts and the shared block summed, then scaled by `sum_scale` (without a shared
    block: the routed experts' sum as it is)."""
    sum_scale = 1.0

    def finish(self, flat: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        if self.shared is None:
            return super().finish(flat, out)
        return ((out + self.shared(flat)) * self.sum_scale).to(flat.dtype)
