"""Blocks shared by the architectures: RMSNorm, rotary embedding, attention."""
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


def wide(x: torch.Tensor) -> torch.Tensor:
    """x in float32 at least: norms, routers and recurrent scans never run in 16 bits."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # normalised in float32 (or wider) whatever the compute dtype, as every reference does
    xf = wide(x)
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * weight).to(x.dtype)


@dataclass(frozen=True)
class RopeSpec:
    dim: int                 # rotated width of each head (<= head_dim)
    base: float
    neox: bool               # pairs half the width apart (True) or consecutive pairs (False)
    scale: float = 1.0       # linear position scaling (positions divided by it)
    freq_factors: tuple[float, ...] | None = None  # Llama-3 `rope_freqs`: frequencies divided by them


def rope_tables(spec: RopeSpec, n_pos: int, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape [n_pos, dim / 2], computed in float64."""
    inv = spec.base ** (-torch.arange(0, spec.dim, 2, dtype=torch.float64) / spec.dim)
    if spec.freq_factors is not None:
        inv = inv / torch.tensor(spec.freq_factors, dtype=torch.float64)
    angles = torch.outer(torch.arange(n_pos, dtype=torch.float64) / spec.scale, inv)
    return angles.cos().to(device, dtype), angles.sin().to(device, dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, spec: RopeSpec) -> torch.Tensor:
    # x: [B, H, T, D]; cos, sin: [T, dim / 2]
    rot, rest = x[..., :spec.dim], x[..., spec.dim:]
    if spec.neox:
        a, b = rot.chunk(2, dim=-1)
    else:
        a, b = rot[..., 0::2], rot[..., 1::2]
    ra, rb = a * cos - b * sin, b * cos + a * sin
    rotated = torch.cat([ra, rb], dim=-1) if spec.neox else torch.stack([ra, rb], dim=-1).flatten(-2)
    return torch.cat([rotated, rest], dim=-1) if rest.shape[-1] else rotated


def causal_mask(n: int, window: int | None, device) -> torch.Tensor | None:
    """Boolean [T, T] mask (True = attend) for a sliding window; None means plain causal."""
    if window is None or window >= n:
        return None
    i = torch.arange(n, device=device)
    diff = i[:, None] - i[None, :]
    return (diff >= 0) & (diff < window)


class Attention(nn.Module):
    """Grouped-query self-attention with optional QKV/output bias, per-head QK-norm, RoPE
    (None: no position encoding) and an output gate (`gated`: Q's projection carries a
    sigmoid gate per head after its queries, as in Qwen3-Next)."""

    def __init__(self, w: dict[str, torch.Tensor], n_head: int, n_kv: int, head_dim: int, scale: float,
                 eps: float, rope: RopeSpec | None, window: int | None = None, gated: bool = False):
        super().__init__()
        self.w, self.n_head, self.n_kv, self.head_dim = w, n_head, n_kv, head_dim
        self.scale, self.eps, self.rope, self.window, self.gated = scale, eps, rope, window, gated

    def forward(self, x: torch.Tensor, tables, state=None) -> torch.Tensor:
        # x: [B, T, hidden]
        B, T, _ = x.shape
        w, D = self.w, self.head_dim
        q = F.linear(x, w["q"], w.get("q_bias")).view(B, T, self.n_head, -1)
        if self.gated:
            q, gate = q[..., :D], q[..., D:].reshape(B, T, self.n_head * D)
        k = F.linear(x, w["k"], w.get("k_bias")).view(B, T, self.n_kv, D)
        v = F.linear(x, w["v"], w.get("v_bias")).view(B, T, self.n_kv, D)
        if "q_norm" in w:
            q, k = rms_norm(q, w["q_norm"], self.eps), rms_norm(k, w["k_norm"], self.eps)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, T, D]
        if self.rope is not None:
            cos, sin = tables.rope(self.rope)
            q, k = apply_rope(q, cos, sin, self.rope), apply_rope(k, cos, sin, self.rope)
        mask = tables.mask(self.window)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                           scale=self.scale, enable_gqa=self.n_kv != self.n_head)
        y = y.transpose(1, 2).reshape(B, T, self.n_head * D)
        if self.gated:
            y = y * torch.sigmoid(gate)
        return F.linear(y, w["o"], w.get("o_bias"))
