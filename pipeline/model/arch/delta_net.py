"""Gated DeltaNet (Qwen3-Next, Qwen3.5 linear-attention layers) and Kimi Delta Attention's rule:
the gated delta rule in blockwise form and step by step, and the mixer that wires it as llama.cpp's
qwen3next/qwen35 graphs do.

Per head, with S [d_k, d_v]:  S = exp(g_t) S;  S += k_t (beta_t (v_t - S^T k_t))^T;  o_t = S^T q_t.
g_t is one decay per head (Gated DeltaNet) or one per key channel, scaling S's rows (KDA).
Recurrent state lives in a dict the caller may pass (keys "conv", "ssm"); without one every
batch row starts from zeros. The rule runs in float32 (or wider) whatever the compute dtype.
"""
import torch
import torch.nn.functional as F

from .blocks import rms_norm, wide
from .recurrent import RecurrentMixer
from .ssm import SCAN_BLOCK, causal_conv1d


def l2_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    # x / sqrt(sum(x^2) + eps), llama.cpp's build_gdn_l2_norm
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def delta_rule_reference(q, k, v, g, beta, state=None):
    """Step by step. q, k [b, T, h, d_k] (q already scaled), v [b, T, h, d_v], g [b, T, h] or
    [b, T, h, d_k], beta [b, T, h], state [b, h, d_k, d_v] -> o [b, T, h, d_v], final state."""
    b, T, h, dk = k.shape
    s = q.new_zeros(b, h, dk, v.shape[-1]) if state is None else state
    per_channel = g.dim() == 4
    out = []
    for t in range(T):
        decay = torch.exp(g[:, t])
        s = s * (decay[..., None] if per_channel else decay[..., None, None])
        kv = torch.einsum("bhkv,bhk->bhv", s, k[:, t])
        delta = (v[:, t] - kv) * beta[:, t, :, None]
        s = s + k[:, t, :, :, None] * delta[:, :, None, :]
        out.append(torch.einsum("bhkv,bhk->bhv", s, q[:, t]))
    return torch.stack(out, dim=1), s


def decayed_products(q, k, k_beta, gc, lower):
    """Within each block, for i >= j: q_i . k_j and k_beta_i . k_j, each term decayed by
    exp(gc_i - gc_j). q, k, k_beta [b, h, n, l, d_k]; gc [b, h, n, l] or, one decay per key
    channel, [b, h, n, l, d_k] -> two [b, h, n, l, l] (zero above the diagonal)."""
    if gc.dim() == 4:
        decay = torch.exp((gc[..., :, None] - gc[..., None, :]).masked_fill(~lower, float("-inf")))
        return q @ k.transpose(-1, -2) * decay, k_beta @ k.transpose(-1, -2) * decay
    qk, kk = (q.new_empty(*q.shape[:-1], q.shape[-2]) for _ in range(2))
    for i in range(q.shape[2]):   # a block at a time: the decays are [b, h, l, l, d_k]
        g = gc[:, :, i]
        decay = torch.exp((g[..., :, None, :] - g[..., None, :, :]).masked_fill(~lower[..., None], float("-inf")))
        qk[:, :, i] = torch.einsum("bhic,bhjc,bhijc->bhij", q[:, :, i], k[:, :, i], decay)
        kk[:, :, i] = torch.einsum("bhic,bhjc,bhijc->bhij", k_beta[:, :, i], k[:, :, i], decay)
    return qk, kk


def delta_rule_blockwise(q, k, v, g, beta, state=None, block: int = SCAN_BLOCK):
    """The same rule over blocks of `block` tokens (WY form: one triangular solve per block,
    then matrix products; the state is carried between blocks). Shapes as the reference."""
    b, T, h, dk = k.shape
    dv = v.shape[-1]
    per_channel = g.dim() == 4
    pad = (-T) % block
    if pad:  # zero steps: g = 0, beta = 0 and k = 0 leave the state untouched
        q, k, v = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (q, k, v))
        g = F.pad(g, (0, 0, 0, 0, 0, pad) if per_channel else (0, 0, 0, pad))
        beta = F.pad(beta, (0, 0, 0, pad))
    n = q.shape[1] // block
    # [b, h, n, l, d], [b, h, n, l] and g as one of them
    q, k, v = (t.view(b, n, block, h, -1).permute(0, 3, 1, 2, 4) for t in (q, k, v))
    beta = beta.view(b, n, block, h).permute(0, 3, 1, 2)
    g = g.view(b, n, block, h, -1).permute(0, 3, 1, 2, 4) if per_channel else (
        g.view(b, n, block, h).permute(0, 3, 1, 2))
    gc = torch.cumsum(g, dim=3)
    decay_k = torch.exp(gc) if per_channel else torch.exp(gc)[..., None]     # per key channel, or broadcast
    lower = torch.tril(torch.ones(block, block, dtype=torch.bool, device=q.device))
    k_beta, v_beta = k * beta[..., None], v * beta[..., None]
    # (I + strictly-lower(beta_i k_i.k_j decay_ij)) W = [v_beta | k_beta exp(gc)]
    diagonal = torch.eye(block, dtype=torch.bool, device=q.device)
    attn, a = decayed_products(q, k, k_beta, gc, lower)                       # causal, decayed
    a = a.masked_fill(lower.logical_not() | diagonal, 0)
    system = a + torch.eye(block, dtype=q.dtype, device=q.device)
    rhs = torch.cat([v_beta, k_beta * decay_k], dim=-1)
    solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    u, w = solved.split([dv, dk], dim=-1)                                     # [b,h,n,l,dv], [b,h,n,l,dk]
    s = q.new_zeros(b, h, dk, dv) if state is None else state
    out = torch.empty_like(u)
    for i in range(n):
        v_new = u[:, :, i] - w[:, :, i] @ s                                   # [b, h, l, dv]
        out[:, :, i] = (q[:, :, i] * decay_k[:, :, i]) @ s + attn[:, :, i] @ v_new
        last = gc[:, :, i, -1:]                                               # [b, h, 1(, dk)]
        k_decayed = k[:, :, i] * (torch.exp(last - gc[:, :, i]) if per_channel else
                                  torch.exp(last - gc[:, :, i])[..., None])
        state_decay = torch.exp(last).transpose(-1, -2) if per_channel else torch.exp(last)[..., None]
        s = s * state_decay + k_decayed.transpose(-1, -2) @ v_new
    return out.permute(0, 2, 3, 1, 4).reshape(b, n * block, h, dv)[:, :T], s


class GatedDeltaNet(RecurrentMixer):
    """qkv and z projections; beta = sigmoid(b), g = softplus(a + dt_bias) * A; conv1d + SiLU on
    qkv; L2-normalised q, k shared by groups of value heads; the delta rule; RMSNorm(o) * gate(z) (SiLU,
    or the family's); out projection. `tiled`: value head j reads key head j % n_k (Qwen3.5 files, whose converter
    reorders the value heads) instead of j // (n_v / n_k) (Qwen3-Next)."""

    def __init__(self, w: dict[str, torch.Tensor | None], n_k: int, n_v: int, d_k: int, eps: float, tiled: bool,
                 gate_act=F.silu):
        super().__init__(w)
        self.n_k, self.n_v, self.d_k, self.eps, self.tiled, self.gate_act = n_k, n_v, d_k, eps, tiled, gate_act
        self.d_v = w["norm"].shape[-1]

    def describe(self) -> str:
        return (f"key_heads={self.n_k}, value_heads={self.n_v}, d_k={self.d_k}, d_v={self.d_v}, tiled={self.tiled}, "
                f"output gate={self.gate_act.__name__}")

    def project_beta_alpha(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, T, hidden] -> b, a of shape [B, T, n_v]."""
        w = self.w
        if "beta_alpha" not in w:
            return F.linear(x, w["beta"]), F.linear(x, w["alpha"])
        B, T, _ = x.shape
        ba = F.linear(x, w["beta_alpha"]).view(B, T, self.n_k, -1)            # per key head: [b | a]
        b, a = ba.chunk(2, dim=-1)
        return b.reshape(B, T, self.n_v), a.reshape(B, T, self.n_v)

    def scan(self, x: torch.Tensor, tables=None, state: dict | None = None) -> torch.Tensor:
        # x: [B, T, hidden]
        w, B, T = self.w, x.shape[0], x.shape[1]
        nk, nv, dk, dv = self.n_k, self.n_v, self.d_k, self.d_v
        qkv, conv_state = causal_conv1d(F.linear(x, w["qkv"]), w["conv"], None, (state or {}).get("conv"))
        q, k, v = wide(F.silu(qkv)).split([nk * dk, nk * dk, nv * dv], dim=-1)
        q, k = (l2_norm(t.view(B, T, nk, dk), self.eps) for t in (q, k))
        repeat = nv // nk
        if repeat > 1:
            q, k = ((t.repeat(1, 1, repeat, 1) if self.tiled else t.repeat_interleave(repeat, dim=2)) for t in (q, k))
        b, a = self.project_beta_alpha(x)
        beta = torch.sigmoid(wide(b))
        g = F.softplus(wide(a) + wide(w["dt_bias"])) * wide(w["A"])     # [B, T, n_v], <= 0
        o, ssm_state = delta_rule_blockwise(q * dk ** -0.5, k, v.view(B, T, nv, dv), g, beta, (state or {}).get("ssm"))
        z = F.linear(x, w["gate"]).view(B, T, nv, dv)
        o = rms_norm(o, wide(w["norm"]), self.eps) * self.gate_act(wide(z))
        if state is not None:
            state["conv"], state["ssm"] = conv_state, ssm_state
        return F.linear(o.reshape(B, T, nv * dv).to(x.dtype), w["out"])
