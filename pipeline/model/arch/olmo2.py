"""olmo2 (OLMo 2, and Olmo 3 under the same name): no norm before attention or the FFN, an RMSNorm
after each instead, on the block's output before it joins the stream; Q and K RMS-normed over
all heads at once; RoPE pairing half the width apart. Olmo 3's files add a sliding window on
three layers of four (or the pattern the file lists), whose RoPE is plain: the base without
the scaling (YaRN) the global layers take, as llama.cpp's llm_build_olmo2 computes them. Its
loader reads rope.freq_base_swa but its graph rotates every layer with the one base, and so do
we (transformers' Olmo 3 gives sliding layers their own base: the two agree where the file's
bases are equal, as in the published checkpoints)."""
from dataclasses import replace

from gguf import MODEL_TENSOR as MT
from gguf import Keys

from .blocks import AttentionSpec
from .family import DecoderArch, LayerSpec
from .loading import BlockTensors
from .modules import PostNormLayer


class Olmo2(DecoderArch):
    neox_rope = True
    swa_period = 4             # llama.cpp's default pattern: every fourth layer global
    honours = frozenset({Keys.Attention.SLIDING_WINDOW, Keys.Attention.SLIDING_WINDOW_PATTERN})

    def layer(self, spec: LayerSpec, t: BlockTensors) -> PostNormLayer:
        # diff: no norm before the blocks, one after each
        return PostNormLayer(spec, self.hp.eps, attention=self.mixer(spec, t), attn_post_norm=t(MT.ATTN_POST_NORM),
                             ffn=self.ffn(spec, t), ffn_post_norm=t(MT.FFN_POST_NORM))

    def attention_spec(self, i: int) -> AttentionSpec:
        spec = replace(super().attention_spec(i), qk_norm_across_heads=True)
        span = int(self.gguf.arch_value(Keys.Attention.SLIDING_WINDOW, 0) or 0)   # 0 or none: every layer global
        if not span or not self.is_sliding(i):
            return spec
        rope = replace(spec.rope, scale=1.0, mscale=1.0, yarn=None)   # diff: RoPE without its scaling
        return replace(spec, span=span, rope=rope)
