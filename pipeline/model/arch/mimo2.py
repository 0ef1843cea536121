"""mimo2 (Xiaomi's MiMo-V2-Flash, MiMo-V2.5): llama's pre-norm layer; attention with keys wider
than values, RoPE half the width apart on part of each head, a sliding window (with its own RoPE
base) on the layers the file lists, learned sinks where a layer has them, and its output scaled
by attention.value_scale; past the dense layers, experts routed by sigmoid (llama.cpp's graph
fixes it) with a selection bias, their weights renormalised and scaled by the file's factor."""

import torch
from gguf import MODEL_TENSOR as MT
from gguf import Keys

from .blocks import Attention, AttentionSpec
from .family import FLOAT32_TENSORS, DecoderArch, LayerSpec
from .gpt_oss import SinkAttention
from .loading import BlockTensors
from .modules import PreNormLayer

VALUE_SCALE = "{arch}.attention.value_scale"


class Mimo2Layer(PreNormLayer):
    """llama's layer, the attention's output scaled before it joins the stream."""

    def __init__(self, spec, eps: float, value_scale: float, **parts):
        super().__init__(spec, eps, **parts)
        self.value_scale = value_scale

    def forward(self, x: torch.Tensor, tables, state=None) -> torch.Tensor:
        h = x + self.mixer(self.norm(x, self.attn_norm), tables) * self.value_scale
        return h + self.ffn(self.norm(h, self.ffn_norm))


class Mimo2(DecoderArch):
    neox_rope = True
    expert_gating = "sigmoid"
    numerics = 2               # 2: the layers without sinks through SDPA's fused kernel (blocks.sdpa: values of
    #                            another head size than the keys')
    blockwise_scores = True    # the sinks are computed outside SDPA
    float32_tensors = FLOAT32_TENSORS + ("attn_sinks.weight",)
    honours = frozenset({Keys.Attention.SLIDING_WINDOW, Keys.Attention.SLIDING_WINDOW_PATTERN,
                         Keys.LLM.EXPERT_WEIGHTS_SCALE})

    def attention_spec(self, i: int) -> AttentionSpec:
        spec = super().attention_spec(i)
        return self.sliding(spec) if self.is_sliding(i) else spec

    def attention(self, spec: AttentionSpec, t: BlockTensors) -> Attention:
        if not t.has(MT.ATTN_SINKS):
            return super().attention(spec, t)
        return SinkAttention(self.attention_weights(spec, t) | {"sinks": t(MT.ATTN_SINKS)}, spec, self.hp.eps)

    def layer(self, spec: LayerSpec, t: BlockTensors) -> Mimo2Layer:
        scale = float(self.key(VALUE_SCALE, 1.0))
        return Mimo2Layer(spec, self.hp.eps, scale, attn_norm=t(MT.ATTN_NORM), mixer=self.mixer(spec, t),
                          ffn_norm=t(MT.FFN_NORM), ffn=self.ffn(spec, t))
