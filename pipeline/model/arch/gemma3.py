"""gemma3: sliding-window layers with their own RoPE base between global layers, QK-norm,
post-attention and post-FFN norms, GeGLU, embedding scaled by sqrt(hidden), tied output, and
the final logit soft-cap where the file sets one.

The GGUF converter already stores Gemma's norm weights as (1 + w).
"""
import math
from dataclasses import replace

import torch
from gguf import MODEL_TENSOR as MT
from gguf import Keys

from ..llama_cpp_numerics import gelu_tanh
from .blocks import AttentionSpec
from .family import DecoderArch, LayerSpec
from .loading import BlockTensors
from .modules import PrePostNormLayer

SWA_ROPE_BASE = 10000.0    # sliding layers' RoPE base when the file has no freq_base_swa
LAYERS_27B = 62            # llama.cpp scales Gemma-3 27B's queries by 1/sqrt(hidden / heads)


class Gemma3(DecoderArch):
    neox_rope = True
    swa_period = 6             # every sixth layer attends globally (llama.cpp and transformers agree)
    activation = staticmethod(gelu_tanh)
    honours = frozenset({Keys.Attention.SLIDING_WINDOW, Keys.Attention.SLIDING_WINDOW_PATTERN,
                         Keys.LLM.FINAL_LOGIT_SOFTCAPPING})

    def __init__(self, gguf):
        super().__init__(gguf)
        self.embed_scale = math.sqrt(self.hp.hidden)

    def layer(self, spec: LayerSpec, t: BlockTensors) -> PrePostNormLayer:
        # diff: each block's output normed before it joins the stream
        return PrePostNormLayer(spec, self.hp.eps, attn_norm=t(MT.ATTN_NORM), attention=self.mixer(spec, t),
                                attn_post_norm=t(MT.ATTN_POST_NORM), ffn_norm=t(MT.FFN_NORM),
                                ffn=self.ffn(spec, t), ffn_post_norm=t(MT.FFN_POST_NORM))

    def attention_spec(self, i: int) -> AttentionSpec:
        spec = super().attention_spec(i)
        span = int(self.gguf.arch_value(Keys.Attention.SLIDING_WINDOW, 0) or 0)   # 0 or none: every layer global
        if not span or not self.is_sliding(i):
            return spec
        # local layers attend over the sliding window, with neither the global RoPE base nor its scaling
        rope = replace(spec.rope, base=float(self.key(Keys.Rope.FREQ_BASE_SWA, SWA_ROPE_BASE)), scale=1.0)
        return replace(spec, span=span, rope=rope)

    def attention_scale(self) -> float:
        if self.hp.n_layers == LAYERS_27B:  # diff: llama.cpp's query_pre_attn_scalar for the 27B
            return 1.0 / math.sqrt(self.hp.hidden / self.hp.n_head)
        return super().attention_scale()

    def finish_logits(self, logits: torch.Tensor) -> torch.Tensor:
        cap = float(self.gguf.arch_value(Keys.LLM.FINAL_LOGIT_SOFTCAPPING, 0.0) or 0.0)
        return logits if not cap else torch.tanh(logits / cap) * cap
