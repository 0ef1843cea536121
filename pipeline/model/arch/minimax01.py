"""minimax-01 (MiniMax-Text-01, MiniMax-M1): lightning attention on the recurrent layers (seven of
eight where the file names neither attention.recurrent_layers nor full_attention_interval),
grouped-query softmax attention with partial NeoX RoPE on the others; each block's output joins
its own normed input scaled by residual_scale (the stream before the norm is dropped); every
layer's feed-forward block experts routed by softmax, the top-k weights renormalised.

Lightning attention, as llama.cpp's graph computes it: one attn_qkv (per head its q, k and v rows)
through SiLU; per head h of layer i, unnormalised linear attention with one decay,
o_t = sum_{s <= t} exp(-lambda (t - s)) (q_t . k_s) v_s, where lambda = slope_h x (1 - i / (layers - 1)
+ 1e-5) and slope_h = 2^(-8 (h + 1) / heads) (ALiBi's); the heads' outputs RMS-normed together
(attn_norm_2), times sigmoid(attn_gate x), then attn_output. llama.cpp runs a sequence in blocks of
its ubatch (512 by default): the decayed scores within a block, the state S = sum of decayed k v^T
carried between them; so do we, in float32 whatever the compute dtype.

Refused, as llama.cpp's loader or graph refuses them: a tensor its loader does not create (biases
beyond Q, K and V's, QK-norms, shared experts, rope_freqs), values not as wide as keys, head counts
that differ between layers, a lone layer of lightning attention (its decay divides by layers - 1).
"""
import math

import numpy as np
import torch
import torch.nn.functional as F
from gguf import MODEL_TENSOR as MT
from gguf import TENSOR_NAMES, Keys
from torch import nn

from ...errors import UserError
from .audit import equals
from .blocks import AttentionSpec, rms_norm, wide
from .family import FLOAT32_TENSORS, AttentionEveryNth, DecoderArch, HParams, LayerSpec
from .loading import BlockTensors
from .modules import Layer
from .recurrent import RecurrentMixer
from .shapes import expect

LIGHTNING_BLOCK = 512   # llama.cpp's default ubatch: the block its graph takes a sequence in
# the tensors llama.cpp's minimax-01 loader creates: (kind, suffix) on each kind of layer
LIGHTNING_TENSORS = [(MT.ATTN_NORM, "weight"), (MT.ATTN_NORM_2, "weight"), (MT.ATTN_QKV, "weight"),
                     (MT.ATTN_GATE, "weight"), (MT.ATTN_OUT, "weight")]
SOFTMAX_TENSORS = [(MT.ATTN_NORM, "weight"), (MT.ATTN_OUT, "weight")] + [
    (kind, suffix) for kind in (MT.ATTN_QKV, MT.ATTN_Q, MT.ATTN_K, MT.ATTN_V) for suffix in ("weight", "bias")]
FFN_TENSORS = [(kind, "weight") for kind in (MT.FFN_NORM, MT.FFN_GATE_INP, MT.FFN_GATE_EXP, MT.FFN_UP_EXP,
                                             MT.FFN_DOWN_EXP)]


def alibi_slopes(n_head: int) -> torch.Tensor:
    """[n_head] float32 slopes, as llama.cpp computes them: start^(h + 1), start = 2^(-8 / heads)."""
    start = np.float32(2) ** -(np.float32(2) ** -(np.log2(np.float32(n_head)) - np.float32(3)))
    return torch.from_numpy(start * start ** np.arange(n_head, dtype=np.float32))


def lightning_decays(slopes: torch.Tensor, scale: float, n: int):
    """The decays of a block of n tokens, as llama.cpp forms them (exp of -slope x distance x scale):
    the queries' from the block's start [h, n], the keys' to its end [h, n], within it [h, n, n]
    (query, key; 0 where the key comes later), and the carried state's across it [h]."""
    pos = torch.arange(n, dtype=slopes.dtype, device=slopes.device)
    neg = -slopes[:, None]                                                       # [h, 1]
    gap = pos[:, None] - pos[None, :]                                            # query - key [n, n]
    within = (neg[..., None] * gap).mul_(scale).masked_fill_(gap < 0, -math.inf).exp_()      # one [h, n, n]
    return (torch.exp(neg * (pos + 1) * scale), torch.exp(neg * (n - 1 - pos) * scale), within,
            torch.exp(slopes * scale * -n))


def lightning_blockwise(q, k, v, slopes, scale: float, state=None, block: int = LIGHTNING_BLOCK):
    """q, k, v [b, T, h, d], slopes [h], scale the layer's -> o [b, T, h, d], final state [b, h, d_k, d_v];
    `state` the one carried in (None: zeros)."""
    b, T, h, d = q.shape
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))                              # [b, h, T, d]
    s = q.new_zeros(b, h, d, v.shape[-1]) if state is None else state
    decays, out = {}, []
    for a in range(0, T, block):
        qb, kb, vb = q[:, :, a:a + block], k[:, :, a:a + block], v[:, :, a:a + block]   # [b, h, n, d]
        n = qb.shape[2]
        if n not in decays:
            decays[n] = lightning_decays(slopes, scale, n)
        q_decay, k_decay, within, across = decays[n]
        scores = (qb @ kb.transpose(-1, -2)).mul_(within)                                # [b, h, n, n]
        out.append((qb * q_decay[..., None]) @ s + scores @ vb)
        s = s * across[:, None, None] + (kb * k_decay[..., None]).transpose(-1, -2) @ vb
    return torch.cat(out, dim=2).transpose(1, 2), s


def lightning_reference(q, k, v, slopes, scale: float, state=None):
    """Step by step: S = exp(-slope x scale) S + k_t v_t^T, o_t = q_t S. Shapes as lightning_blockwise."""
    b, T, h, d = q.shape
    s = q.new_zeros(b, h, d, v.shape[-1]) if state is None else state
    decay = torch.exp(-slopes * scale)[:, None, None]                             # [h, 1, 1]
    out = []
    for t in range(T):
        s = decay * s + k[:, t, :, :, None] * v[:, t, :, None, :]
        out.append(torch.einsum("bhk,bhkv->bhv", q[:, t], s))
    return torch.stack(out, dim=1), s


class LightningAttention(RecurrentMixer):
    """x [B, T, hidden] -> [B, T, hidden]; `state` carries the decayed key-value products ("kv")."""

    def __init__(self, w: dict[str, torch.Tensor | None], n_head: int, head_dim: int, eps: float, scale: float):
        super().__init__(w)
        self.n_head, self.head_dim, self.eps, self.scale = n_head, head_dim, eps, scale

    def describe(self) -> str:
        return f"heads={self.n_head}, head_dim={self.head_dim}, slope scale={self.scale:g}"

    def scan(self, x: torch.Tensor, tables=None, state: dict | None = None) -> torch.Tensor:
        w, (B, T, _), h, d = self.w, x.shape, self.n_head, self.head_dim
        qkv = wide(F.silu(F.linear(x, w["qkv"]))).view(B, T, h, 3 * d)
        q, k, v = qkv.split(d, dim=-1)                                               # [B, T, h, d] each
        o, kv = lightning_blockwise(q, k, v, alibi_slopes(h).to(x.device), self.scale, (state or {}).get("kv"))
        if state is not None:
            state["kv"] = kv
        gate = torch.sigmoid(wide(F.linear(x, w["gate"])))                           # [B, T, h d]
        o = rms_norm(o.reshape(B, T, h * d), wide(w["norm"]), self.eps) * gate
        return F.linear(o.to(x.dtype), w["out"])


class NormResidualLayer(Layer):
    """llama.cpp's minimax-01 layer: each block's output joins its own normed input, scaled by
    residual_scale."""

    def __init__(self, spec, eps: float, residual_scale: float, **parts):
        super().__init__(spec, eps, **parts)
        self.residual_scale = residual_scale

    def describe(self) -> str:
        return f"{super().describe()}, residual scale={self.residual_scale:g}"

    def forward(self, x: torch.Tensor, tables, state: dict | None = None) -> torch.Tensor:
        a = self.norm(x, self.attn_norm)
        h = self.mixer(a, tables, state) + a * self.residual_scale
        f = self.norm(h, self.ffn_norm)
        return self.ffn(f) + f * self.residual_scale


class Minimax01(AttentionEveryNth, DecoderArch):
    neox_rope = True
    full_attention_interval = 8
    honours = frozenset({Keys.LLM.RESIDUAL_SCALE})
    float32_tensors = FLOAT32_TENSORS + ("_norm_2.weight",)   # the lightning heads' output norm

    def __init__(self, gguf):
        super().__init__(gguf)
        self.residual_scale = float(self.key(Keys.LLM.RESIDUAL_SCALE))   # required by llama.cpp's loader
        self.check_lightning_tensors()

    def settings_not_computed(self) -> dict:
        # llama.cpp's loader creates no tensors past the trunk: it refuses a file with any
        return super().settings_not_computed() | {Keys.LLM.NEXTN_PREDICT_LAYERS: equals(0)}

    def read_hparams(self) -> HParams:
        hp = super().read_hparams()
        for template in (Keys.Attention.HEAD_COUNT, Keys.Attention.HEAD_COUNT_KV):
            if len(set(np.ravel(self.key(template, hp.n_head)).tolist())) > 1:
                raise UserError(f"{self.gguf.path}: {template.format(arch=self.gguf.architecture)} differs between "
                                f"layers; llama.cpp's minimax-01 graph takes one for every layer")
        return hp

    def layer_spec(self, i: int) -> LayerSpec:
        if not self.is_recurrent(i):
            return LayerSpec(i, "attention", "moe", self.attention_spec(i))
        if self.hp.n_layers == 1:
            raise UserError(f"{self.gguf.path}: a lone layer of lightning attention: llama.cpp's decay divides by "
                            f"block_count - 1")
        return LayerSpec(i, "lightning", "moe")

    def attention_spec(self, i: int) -> AttentionSpec:
        spec = super().attention_spec(i)
        if spec.value_dim != spec.key_dim:
            raise UserError(f"{self.gguf.path}: value_length {spec.value_dim} is not key_length {spec.key_dim}; "
                            f"llama.cpp's minimax-01 graph asserts they are equal")
        return spec

    def attention_score_bytes(self, batch: int, ctx: int, n_head: int, device: str) -> int:
        """Beside softmax attention's: a lightning block's float32 scores for each sequence and the
        block's decays, [heads, block, block] each (measured at hidden 2048: 182 MiB at the peak, 188
        counted)."""
        block = min(ctx, LIGHTNING_BLOCK)
        lightning = any(spec.mixer == "lightning" for spec in self.specs)
        return super().attention_score_bytes(batch, ctx, n_head, device) + (
            4 * (batch + 1) * self.hp.n_head * block * block if lightning else 0)

    def layer(self, spec: LayerSpec, t: BlockTensors) -> NormResidualLayer:
        return NormResidualLayer(spec, self.hp.eps, self.residual_scale, attn_norm=t(MT.ATTN_NORM),
                                 mixer=self.mixer(spec, t), ffn_norm=t(MT.FFN_NORM), ffn=self.ffn(spec, t))

    def mixer(self, spec: LayerSpec, t: BlockTensors) -> nn.Module:
        if spec.mixer != "lightning":
            return super().mixer(spec, t)
        w = {"qkv": t(MT.ATTN_QKV), "gate": t(MT.ATTN_GATE), "norm": t(MT.ATTN_NORM_2), "out": t(MT.ATTN_OUT)}
        return LightningAttention(w, self.hp.n_head, self.hp.head_dim, self.hp.eps, self.slope_scale(spec.index))

    def slope_scale(self, i: int) -> float:
        """Layer i's factor of the slopes, 1 - i / (layers - 1) + 1e-5, rounded to float as llama.cpp's."""
        return float(np.float32(1.0 - i / (self.hp.n_layers - 1) + 1e-5))

    def check_lightning_tensors(self) -> None:
        """The lightning layers' tensors of heads x head size, and no tensor in the file beyond those
        llama.cpp's loader creates."""
        hp = self.hp
        inner = hp.n_head * hp.head_dim
        loaded = {TENSOR_NAMES[kind] + ".weight" for kind in (MT.TOKEN_EMBD, MT.OUTPUT_NORM, MT.OUTPUT)}
        for spec in self.specs:
            kinds = LIGHTNING_TENSORS if spec.mixer == "lightning" else SOFTMAX_TENSORS
            loaded |= {f"{TENSOR_NAMES[kind].format(bid=spec.index)}.{suffix}" for kind, suffix in kinds + FFN_TENSORS}
            if spec.mixer != "lightning":
                continue
            for kind, shape, why in (("attn_qkv", (3 * inner, hp.hidden), "3 x heads x key_length x embedding_length"),
                                     ("attn_gate", (inner, hp.hidden), "heads x key_length x embedding_length"),
                                     ("attn_norm_2", (inner,), "heads x key_length"),
                                     ("attn_output", (hp.hidden, inner), "embedding_length x heads x key_length")):
                expect(self, f"blk.{spec.index}.{kind}.weight", shape, why, required=True)
        extra = sorted(set(self.gguf.tensors) - loaded)
        if extra:
            raise UserError(f"{self.gguf.path}: tensor {extra[0]} is not one llama.cpp's minimax-01 loader creates "
                            f"(it refuses such a file)")
