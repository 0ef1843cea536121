"""gpt-oss: attention with learned sinks (one logit per head in each softmax denominator,
attending to nothing), sliding-window attention on every other layer (the last of each pair is
global), YaRN NeoX RoPE, biases on Q/K/V/O, on the router and on every expert; the router's top-k
logits are softmaxed among themselves; experts are gpt-oss's clamped SwiGLU; the post-attention
norm is the FFN's pre-norm."""
import math

import torch
from gguf import MODEL_TENSOR as MT
from gguf import Keys

from .blocks import AttentionSpec, BlockwiseAttention
from .family import FLOAT32_TENSORS, DecoderArch, LayerSpec
from .ffn import MoE, swiglu_oai
from .loading import BlockTensors
from .modules import PreNormLayer

EXPERT_BIASES = {"up": MT.FFN_UP_EXP, "gate": MT.FFN_GATE_EXP, "down": MT.FFN_DOWN_EXP}


class SinkAttention(BlockwiseAttention):
    """Attention whose softmax over each query's keys has one more logit, the head's sink, which
    no value follows: the weights of the keys sum to less than 1. SDPA cannot add the column."""

    def probabilities(self, scores: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
        _, KV, G, _, n_keys = scores.shape
        sinks = self.sinks.view(1, KV, G, 1, 1)
        scores = scores.masked_fill_(~seen, -math.inf)
        return torch.cat([scores, sinks.expand(*scores.shape[:-1], 1)], dim=-1).softmax(-1)[..., :n_keys]


class GptOss(DecoderArch):
    neox_rope = True
    swa_period = 2
    expert_gating = "softmax_weight"
    honours = frozenset({Keys.Attention.SLIDING_WINDOW, Keys.Attention.SLIDING_WINDOW_PATTERN})
    float32_tensors = FLOAT32_TENSORS + ("attn_sinks.weight",)   # a logit of each softmax
    blockwise_scores = True    # the sinks are computed outside SDPA

    def layer(self, spec: LayerSpec, t: BlockTensors) -> PreNormLayer:
        # diff: the FFN's pre-norm is stored as the post-attention norm
        return PreNormLayer(spec, self.hp.eps, attn_norm=t(MT.ATTN_NORM), mixer=self.mixer(spec, t),
                            ffn_norm=t(MT.ATTN_POST_NORM), ffn=self.ffn(spec, t))

    def attention(self, spec: AttentionSpec, t: BlockTensors) -> SinkAttention:
        return SinkAttention(self.attention_weights(spec, t), spec, self.hp.eps)

    def attention_spec(self, i: int) -> AttentionSpec:
        spec = super().attention_spec(i)
        return self.sliding(spec) if self.is_sliding(i) else spec

    def attention_weights(self, spec: AttentionSpec, t: BlockTensors) -> dict[str, torch.Tensor | None]:
        return super().attention_weights(spec, t) | {"sinks": t(MT.ATTN_SINKS)}

    def normalizes_expert_weights(self) -> bool:
        return False   # the softmax over the chosen logits already sums to 1

    def gated_unit(self, i: int, shared: bool = False):
        return swiglu_oai

    def moe(self, i: int, t: BlockTensors) -> MoE:
        return MoE(router=t(MT.FFN_GATE_INP), experts=self.routed_experts(t), act=self.activation,
                   routing=self.routing(i), router_bias=t(MT.FFN_GATE_INP, "bias"),
                   expert_biases={role: t(kind, "bias") for role, kind in EXPERT_BIASES.items()},
                   glu=self.gated_unit(i))
