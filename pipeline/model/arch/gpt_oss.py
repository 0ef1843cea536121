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

from .blocks import Attention, AttentionSpec
from .family import FLOAT32_TENSORS, DecoderArch, LayerSpec
from .ffn import MoE, swiglu_oai
from .loading import BlockTensors
from .modules import PreNormLayer

EXPERT_BIASES = {"up": MT.FFN_UP_EXP, "gate": MT.FFN_GATE_EXP, "down": MT.FFN_DOWN_EXP}


# the float32 scores of one block of queries (three tensors of them: scores, with the sink
# column, softmax) are kept under this, whatever the context and batch
SINK_SCORE_BYTES = 256 * 2 ** 20


class SinkAttention(Attention):
    """Attention whose softmax over each query's keys has one more logit, the head's sink, which
    no value follows: the weights of the keys sum to less than 1. SDPA cannot add the column, so
    the scores are formed here, a block of queries at a time."""

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tables) -> torch.Tensor:
        # q [B, H, T, D], k and v [B, KV, T, D] -> [B, H, T, D]
        B, H, T, D = q.shape
        KV = k.shape[1]
        q = q.reshape(B, KV, H // KV, T, D)
        k, v = k[:, :, None], v[:, :, None]                                           # [B, KV, 1, T, D]
        mask = tables.mask(self.spec.span, self.spec.chunk)
        positions = torch.arange(T, device=q.device)
        sinks = self.sinks.view(1, KV, H // KV, 1, 1)
        rows = max(1, SINK_SCORE_BYTES // (3 * 4 * B * H * T))
        k, v = k.float(), v.float()            # scores, softmax and their sum over values in float32, as SDPA's
        out = []
        for a in range(0, T, rows):
            b = min(a + rows, T)                   # queries [a, b) see keys before b at most
            scores = (q[..., a:b, :].float() @ k[..., :b, :].transpose(-1, -2)) * self.spec.scale  # [B, KV, G, b-a, b]
            seen = positions[a:b, None] >= positions[None, :b] if mask is None else mask[a:b, :b]
            scores = scores.masked_fill(~seen, -math.inf)
            probs = torch.cat([scores, sinks.expand(*scores.shape[:-1], 1)], dim=-1).softmax(-1)[..., :b]
            out.append((probs @ v[..., :b, :]).to(q.dtype))                           # [B, KV, G, b-a, D]
        return torch.cat(out, dim=-2).reshape(B, H, T, v.shape[-1])


class GptOss(DecoderArch):
    neox_rope = True
    swa_period = 2
    expert_gating = "softmax_weight"
    honours = frozenset({Keys.Attention.SLIDING_WINDOW, Keys.Attention.SLIDING_WINDOW_PATTERN})
    float32_tensors = FLOAT32_TENSORS + ("attn_sinks.weight",)   # a logit of each softmax

    def layer(self, spec: LayerSpec, t: BlockTensors) -> PreNormLayer:
        # diff: the FFN's pre-norm is stored as the post-attention norm
        return PreNormLayer(spec, self.hp.eps, attn_norm=t(MT.ATTN_NORM), mixer=self.mixer(spec, t),
                            ffn_norm=t(MT.ATTN_POST_NORM), ffn=self.ffn(spec, t))

    def attention(self, spec: AttentionSpec, t: BlockTensors) -> SinkAttention:
        return SinkAttention(self.attention_weights(spec, t), spec, self.hp.eps)

    def attention_score_bytes(self, batch: int, ctx: int, n_head: int, device: str) -> int:
        """The masks, and on every device three float32 score tensors of a block of queries (at
        most SINK_SCORE_BYTES): the sinks are computed outside SDPA."""
        masks = ctx * ctx if self.masked_layers(ctx) else 0
        return masks + min(3 * 4 * batch * n_head * ctx * ctx, SINK_SCORE_BYTES)

    def attention_spec(self, i: int) -> AttentionSpec:
        spec = super().attention_spec(i)
        if not self.is_sliding(i):
            return spec
        rope = replace(spec.rope, base=float(self.key(Keys.Rope.FREQ_BASE_SWA, spec.rope.base)))
        return replace(spec, span=int(self.key(Keys.Attention.SLIDING_WINDOW)), rope=rope)

    def attention_weights(self, spec: AttentionSpec, t: BlockTensors) -> dict[str, torch.Tensor | None]:
        return super().attention_weights(spec, t) | {"sinks": t(MT.ATTN_SINKS)}

    def normalizes_expert_weights(self) -> bool:
        return False   # the softmax over the chosen logits already sums to 1

    def moe(self, i: int, t: BlockTensors) -> MoE:
        return MoE(router=t(MT.FFN_GATE_INP), experts=self.routed_experts(t), act=self.activation,
                   routing=self.routing(i), router_bias=t(MT.FFN_GATE_INP, "bias"),
                   expert_biases={role: t(kind, "bias") for role, kind in EXPERT_BIASES.items()}, glu=swiglu_oai)
