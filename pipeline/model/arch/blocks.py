"""Blocks shared by the architectures: the module that holds a block's tensors, RMSNorm,
attention (with rotary embedding from rope.py), and attention whose scores SDPA cannot form."""
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ...numerics import emulating
from ..llama_cpp_numerics import kv_cached, shared_input
from .rope import RopeSpec, apply_rope

# the float32 scores of one block of queries (three tensors of them: scores, their transform,
# softmax) that BlockwiseAttention keeps under this, whatever the context and batch
SCORE_BLOCK_BYTES = 256 * 2 ** 20


class Weights(nn.Module):
    """A module whose tensors (never trained) are buffers: `print` shows each with its shape and
    dtype, `module_bytes` counts them. `w` maps the names of the tensors present to them;
    an optional tensor the file lacks is registered as None and left out of `w`."""

    def __init__(self, weights: dict[str, torch.Tensor | None]):
        super().__init__()
        for name, t in weights.items():
            self.register_buffer(name, t, persistent=False)

    @property
    def w(self) -> dict[str, torch.Tensor]:
        return {name: t for name, t in self._buffers.items() if t is not None}

    def describe(self) -> str:
        """The module's settings, for `print` (the tensors are listed after them)."""
        return ""

    def extra_repr(self) -> str:
        tensors = [f"{name}: {list(t.shape)} {str(t.dtype).removeprefix('torch.')}" for name, t in self.w.items()]
        return ", ".join(filter(None, [self.describe(), *tensors]))


def module_bytes(module: nn.Module) -> int:
    """Bytes of the tensors a module and its submodules hold."""
    return sum(t.numel() * t.element_size() for t in module.buffers())


def wide(x: torch.Tensor) -> torch.Tensor:
    """x in float32 at least: norms, routers and recurrent scans never run in 16 bits."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    # normalised in float32 (or wider) whatever the compute dtype, as every reference does; no
    # weight: the plain (L2) normalisation
    xf = wide(x)
    xf = xf * torch.rsqrt(mean_square(xf) + eps)
    return (xf if weight is None else xf * weight).to(x.dtype)


def mean_square(x: torch.Tensor) -> torch.Tensor:
    """The mean of x's squares over its last axis [..., 1]; in llama-cpp numerics as ggml-cpu's
    rms_norm takes it: the float32 squares summed in float64, the mean rounded to float32 (a sum
    in float32 lands a step away in a fifth of the rows, and a Q8 quantizer downstream rounds on
    that step)."""
    if emulating():
        return (x * x).double().mean(-1, keepdim=True).to(x.dtype)
    return x.pow(2).mean(-1, keepdim=True)


def layer_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    # mean-subtracted LayerNorm over the last axis, without bias (ggml's LLM_NORM), in float32 (or
    # wider); `weight` broadcasts over the leading axes (Cohere's per-head QK-norm weights [H, D])
    xf = wide(x)
    xf = xf - xf.mean(-1, keepdim=True)
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf if weight is None else xf * weight).to(x.dtype)


def causal_mask(n: int, span: int | None, device, chunk: int | None = None) -> torch.Tensor | None:
    """Boolean [T, T] mask (True = attend) for sliding-window attention over the `span` latest
    positions, or chunked attention (each position sees the earlier ones of its `chunk`-long
    chunk); None means plain causal."""
    if (span is None or span >= n) and (chunk is None or chunk >= n):
        return None
    i = torch.arange(n, device=device)
    diff = i[:, None] - i[None, :]
    mask = diff >= 0
    if span is not None:
        mask &= diff < span
    if chunk is not None:
        mask &= (i[:, None] // chunk) == (i[None, :] // chunk)
    return mask


def packed_mask(layout: torch.Tensor, span: int | None, chunk: int | None = None) -> torch.Tensor:
    """Boolean [B, 1, T, T] mask (True = attend) of packed rows, layout [B, T, LAYOUT_FIELDS]
    (position, sequence, branch): a token sees the tokens before it of its sequence that are
    shared (branch 0) or of its own branch, and the window or chunk by positions, not by places in
    the row."""
    pos, seq, branch = layout.unbind(-1)                                                  # [B, T] each
    place = torch.arange(pos.shape[1], device=layout.device)
    mask = (place[:, None] >= place[None, :]) & (seq[:, :, None] == seq[:, None, :])      # [B, T, T]
    mask &= (branch[:, None, :] == 0) | (branch[:, :, None] == branch[:, None, :])
    if span is not None:
        mask &= pos[:, :, None] - pos[:, None, :] < span
    if chunk is not None:
        mask &= pos[:, :, None] // chunk == pos[:, None, :] // chunk
    return mask[:, None]


@dataclass(frozen=True)
class Temperature:
    """Llama-4-style attention temperature: queries at position p multiplied by
    1 + scale * ln(floor((p + offset) / length) + 1)."""
    scale: float
    length: int
    offset: float = 0.0


def temperature_factors(t: Temperature, n_pos: int, device, dtype) -> torch.Tensor:
    """[n_pos, 1] query factors, computed in float64."""
    pos = torch.arange(n_pos, dtype=torch.float64)
    return (torch.log(torch.floor((pos + t.offset) / t.length) + 1) * t.scale + 1)[:, None].to(device, dtype)


@dataclass(frozen=True)
class AttentionSpec:
    """The facts of one attention layer, read from the metadata once."""
    n_head: int
    n_kv: int
    key_dim: int              # head size of Q and K
    value_dim: int            # head size of V, and of each head's output
    scale: float              # applied to Q.K
    rope: RopeSpec | None     # None: no position encoding
    span: int | None = None   # sliding window: each position sees the `span` latest; None: all before it
    gated: bool = False       # Q's projection carries a sigmoid output gate per head (Qwen3-Next)
    temperature: Temperature | None = None   # position-dependent query scale
    qk_norm_across_heads: bool = False       # Q and K RMS-normed over all heads at once, before the head split
    chunk: int | None = None                 # chunked attention: each position sees its chunk's earlier ones
    unit_qk_norm: bool = False               # Q and K RMS-normed without weights after RoPE (Llama 4)


class Attention(Weights):
    """Grouped-query self-attention with optional QKV/output bias, per-head QK-norm, RoPE and an
    output gate (`spec.gated`: Q's projection holds, per head, the queries then the gate; or a
    `gate` projection of its own, one gate per value or per head), sigmoid(gate) x the heads'
    outputs before the output projection (`own_gate` of a gate projection of its own)."""
    own_gate = staticmethod(torch.sigmoid)
    flash = True   # llama.cpp computes it with flash attention (BlockwiseAttention's False: without)

    def __init__(self, w: dict[str, torch.Tensor | None], spec: AttentionSpec, eps: float):
        super().__init__(w)
        self.spec, self.eps = spec, eps

    def describe(self) -> str:
        s, r = self.spec, self.spec.rope
        rope = "none" if r is None else f"{'neox' if r.neox else 'pairs'} dim={r.dim} base={r.base:g} scale={r.scale:g}"
        rope += " with freq factors" if r is not None and r.freq_factors else ""
        temperature = "" if s.temperature is None else f", {s.temperature}"
        return (f"heads={s.n_head}, kv_heads={s.n_kv}, key_dim={s.key_dim}, value_dim={s.value_dim}, "
                f"scale={s.scale:g}, span={s.span}, gated={s.gated}, rope=({rope}){temperature}")

    def forward(self, x: torch.Tensor, tables, state=None) -> torch.Tensor:
        # x: [B, T, hidden]
        B, T, _ = x.shape
        w, s = self.w, self.spec
        linear = shared_input(x, w["q"], w["k"], w["v"])
        q, k = linear(w["q"], w.get("q_bias")), linear(w["k"], w.get("k_bias"))
        if s.qk_norm_across_heads:
            q, k = rms_norm(q, w["q_norm"], self.eps), rms_norm(k, w["k_norm"], self.eps)
        q = q.view(B, T, s.n_head, -1)
        if s.gated:
            q, gate = q[..., :s.key_dim], q[..., s.key_dim:].reshape(B, T, s.n_head * s.value_dim)
        k = k.view(B, T, s.n_kv, s.key_dim)
        v = linear(w["v"], w.get("v_bias")).view(B, T, s.n_kv, s.value_dim)
        del linear
        if "q_norm" in w and not s.qk_norm_across_heads:
            q, k = self.head_norm(q, w["q_norm"]), self.head_norm(k, w["k_norm"])
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, T, D]
        if s.rope is not None:
            cos, sin = tables.rope(s.rope)
            q, k = apply_rope(q, cos, sin, s.rope), apply_rope(k, cos, sin, s.rope)
        q, k = self.after_rope(q, k)
        if s.temperature is not None:
            q = q * tables.temperature(s.temperature)       # [T, 1]
        k, v = kv_cached(k), kv_cached(v)                  # as the cache holds them
        y = self.attend_from(x, q, k, v, tables)           # [B, H, T, value_dim]
        y = y.transpose(1, 2).reshape(B, T, s.n_head * s.value_dim)
        if s.gated:
            y = y * torch.sigmoid(gate)
        elif "gate" in w:   # a gate projection of its own: per value (AFMoE's attn_gate) or per head (Step-3.5's)
            gate = self.own_gate(F.linear(x, w["gate"]))                   # [B, T, heads x value_dim] or [B, T, heads]
            y = (y.view(B, T, s.n_head, -1) * gate.view(B, T, s.n_head, -1)).view(B, T, -1)
        return F.linear(y, w["o"], w.get("o_bias"))

    def after_rope(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The rotated heads q [B, H, T, D], k [B, KV, T, D] as attention takes them (and the cache
        holds the keys): normed to unit RMS where the spec says so; a family's attention overrides it."""
        if self.spec.unit_qk_norm:
            return rms_norm(q, None, self.eps), rms_norm(k, None, self.eps)
        return q, k

    def head_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """Each head of x [B, T, heads, D] normed (QK-norm per head): RMSNorm; a family's attention
        overrides it."""
        return rms_norm(x, weight, self.eps)

    def attend_from(self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tables) -> torch.Tensor:
        """The heads' attention, where the keys a query sees may depend on the layer's input x
        [B, T, hidden] too (a sparse form overrides it): attend."""
        return self.attend(q, k, v, tables)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tables) -> torch.Tensor:
        """softmax(scale q.k + mask) v: q [B, H, T, key_dim], k [B, KV, T, key_dim], v [B, KV, T,
        value_dim] -> [B, H, T, value_dim]. The seam for attention that SDPA cannot express
        (attention sinks, logit soft-capping): a family's attention overrides it."""
        mask = tables.mask(self.spec.span, self.spec.chunk)
        return sdpa(q, k, v, attn_mask=mask, is_causal=mask is None, scale=self.spec.scale,
                    enable_gqa=self.spec.n_kv != self.spec.n_head)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, **kw) -> torch.Tensor:
    """SDPA of q, k [B, H, T, key_dim] over v [B, KV, T, value_dim] -> [B, H, T, value_dim]. A value
    head narrower than the key's (latent attention's 128 beside 192) is padded with zeros to it and
    the output cut back: SDPA's fused kernels take one head size, and its math kernel, which takes
    two, holds the [B, H, T, T] scores (2.45 float32 score tensors measured on the CPU)."""
    dv = v.shape[-1]
    if dv < q.shape[-1]:
        v = F.pad(v, (0, q.shape[-1] - dv))                                   # [B, KV, T, key_dim]
    return F.scaled_dot_product_attention(q, k, v, scale=scale, **kw)[..., :dv]


class BlockwiseAttention(Attention):
    """Attention whose scores SDPA cannot express (sinks, soft-capped logits): float32 scores
    formed here, a block of queries at a time (at most SCORE_BLOCK_BYTES of them), and turned
    into the weights of the values by the form's `probabilities`. In llama-cpp numerics, a family
    whose attention llama.cpp computes without flash attention (`flash = False`) has its queries
    and the weights of the values rounded to float16, as ggml's products with the float16 cache
    take them."""

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tables,
               selected: torch.Tensor | None = None) -> torch.Tensor:
        # q [B, H, T, D], k and v [B, KV, T, D] -> [B, H, T, D]; selected [B, KV, T, T] bool: the keys
        # each query of a KV group may see besides the mask (None: all)
        B, H, T, D = q.shape
        KV = k.shape[1]
        q = q.reshape(B, KV, H // KV, T, D)
        k, v = k[:, :, None], v[:, :, None]                                           # [B, KV, 1, T, D]
        mask = tables.mask(self.spec.span, self.spec.chunk)
        positions = torch.arange(T, device=q.device)
        rows = max(1, SCORE_BLOCK_BYTES // (3 * 4 * B * H * T))
        k, v = k.float(), v.float()            # scores, softmax and their sum over values in float32, as SDPA's
        unfused = emulating() and not self.flash
        if unfused:
            q = q.half().to(q.dtype)
        out = []
        for a in range(0, T, rows):
            b = min(a + rows, T)                   # queries [a, b) see keys before b at most
            scores = (q[..., a:b, :].float() @ k[..., :b, :].transpose(-1, -2)) * self.spec.scale  # [B, KV, G, b-a, b]
            seen = positions[a:b, None] >= positions[None, :b] if mask is None else mask[..., a:b, :b]
            if seen.dim() == 4:                                  # packed rows' [B, 1, b-a, b]
                seen = seen[:, :, None]                                                    # [B, 1, 1, b-a, b]
            if selected is not None:
                seen = seen & selected[:, :, None, a:b, :b]                                # [B, KV, 1, b-a, b]
            weights = self.probabilities(scores, seen)
            if unfused:
                weights = weights.half().float()
            out.append((weights @ v[..., :b, :]).to(q.dtype))                                # [B, KV, G, b-a, D]
        return torch.cat(out, dim=-2).reshape(B, H, T, v.shape[-1])

    def probabilities(self, scores: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
        """scores [B, KV, G, queries, keys] float32 (the form's to overwrite), seen [queries, keys]
        bool (or broadcast to the scores) -> the weights of the keys' values."""
        raise NotImplementedError


def blockwise_score_bytes(batch: int, ctx: int, n_head: int) -> int:
    """What BlockwiseAttention holds beyond a forward's activations: three float32 score tensors of
    a block of queries, at most SCORE_BLOCK_BYTES."""
    return min(3 * 4 * batch * n_head * ctx * ctx, SCORE_BLOCK_BYTES)


class SoftCappedAttention(BlockwiseAttention):
    """Attention whose logits are soft-capped before the mask and the softmax, cap * tanh(s / cap)
    (Gemma 2)."""

    def __init__(self, w: dict[str, torch.Tensor | None], spec: AttentionSpec, eps: float, cap: float):
        super().__init__(w, spec, eps)
        self.cap = cap

    def describe(self) -> str:
        return f"{super().describe()}, logit cap={self.cap:g}"

    def probabilities(self, scores: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
        # in place: the scores and their softmax are the block's only copies
        return scores.div_(self.cap).tanh_().mul_(self.cap).masked_fill_(~seen, -math.inf).softmax(-1)
