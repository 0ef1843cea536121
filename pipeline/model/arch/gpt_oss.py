"""gpt-oss: attention with learned sinks (one logit per head in each softmax denominator,
attending to nothing), sliding-window attention on every other layer (the last of each pair is
global), YaRN NeoX RoPE, biases on Q/K/V/O, on the router and on every expert; the router's top-k
logits are softmaxed among themselves; experts are gpt-oss's clamped SwiGLU; the post-attention
norm is the FFN's pre-norm."""
import math
from dataclasses import replace

import torch
from gguf import MODEL_TENSOR as MT
from gguf import Keys

from .base import BlockTensors, DecoderArch
from .blocks import Attention, AttentionSpec
from .ffn import MoE, swiglu_oai

EXPERT_BIASES = {"up": MT.FFN_UP_EXP, "gate": MT.FFN_GATE_EXP, "down": MT.FFN_DOWN_EXP}


class SinkAttention(Attention):
    """Attention whose softmax over each query's keys has one more logit, the head's sink, which
    no value follows: the weights of the keys sum to less than 1."""

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tables) -> torch.Tensor:
        # q [B, H, T, D], k and v [B, KV, T, D] -> [B, H, T, D]
        B, H, T, D = q.shape
        KV = k.shape[1]
        q = q.reshape(B, KV, H // KV, T, D)
        scores = (q @ k[:, :, None].transpose(-1, -2)).float() * self.spec.scale      # [B, KV, G, T, T]
        mask = tables.mask(self.spec.span, self.spec.chunk)
        if mask is None:
            mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~mask, -math.inf)
        sinks = self.sinks.view(1, KV, H // KV, 1, 1).expand(B, KV, H // KV, T, 1)
        probs = torch.cat([scores, sinks], dim=-1).softmax(-1)[..., :T]                # [B, KV, G, T, T]
        return (probs.to(v.dtype) @ v[:, :, None]).reshape(B, H, T, v.shape[-1])


class GptOss(DecoderArch):
    neox_rope = True
    ffn_norm = MT.ATTN_POST_NORM
    swa_period = 2
    expert_gating = "softmax_weight"
    honours = frozenset({Keys.Attention.SLIDING_WINDOW, Keys.Attention.SLIDING_WINDOW_PATTERN})

    def attention_spec(self, i: int) -> AttentionSpec:
        spec = super().attention_spec(i)
        if not self.is_sliding(i):
            return spec
        rope = replace(spec.rope, base=float(self.key(Keys.Rope.FREQ_BASE_SWA, spec.rope.base)))
        return replace(spec, span=int(self.key(Keys.Attention.SLIDING_WINDOW)), rope=rope)

    def attention(self, spec: AttentionSpec, t: BlockTensors) -> Attention:
        plain = super().attention(spec, t)
        return SinkAttention({**plain.w, "sinks": t(MT.ATTN_SINKS)}, spec, self.hp.eps)

    def normalizes_expert_weights(self) -> bool:
        return False   # the softmax over the chosen logits already sums to 1

    def moe(self, i: int, t: BlockTensors) -> MoE:
        return MoE(router=t(MT.FFN_GATE_INP), experts=self.routed_experts(t), act=self.activation,
                   routing=self.routing(i), router_bias=t(MT.FFN_GATE_INP, "bias"),
                   expert_biases={role: t(kind, "bias") for role, kind in EXPERT_BIASES.items()}, glu=swiglu_oai)
