"""afmoe (Arcee's Trinity): each block between a norm of its input and one of its output, as
Gemma 3's; attention with per-head QK-norm and a sigmoid gate of its own (attn_gate) on the
heads' outputs, a sliding window on three layers of four, the fourth global and without RoPE
(llama.cpp's fixed step of 4); the embedding scaled by sqrt(hidden) (llama.cpp's graph always
scales it); past the leading dense blocks, experts routed by the file's gating function (sigmoid
where it names none) with a selection bias, the file's weight norm and scale, beside shared
experts."""
import math
from dataclasses import replace

from gguf import MODEL_TENSOR as MT
from gguf import Keys

from .blocks import AttentionSpec
from .family import DecoderArch, DenseThenSigmoidExperts, LayerSpec
from .loading import BlockTensors
from .modules import PrePostNormLayer

NO_ROPE_STEP = 4   # llama.cpp's n_no_rope_layer_step, which no key of this family sets


class GatedPrePostNorm:
    """Gemma 3's layer (each block between a norm of its input and one of its output: `layer_module`)
    around attention with a sigmoid gate of its own (attn_gate) on the heads' outputs (mixed in before
    DecoderArch)."""
    layer_module = PrePostNormLayer

    def attention_weights(self, spec: AttentionSpec, t: BlockTensors) -> dict:
        return super().attention_weights(spec, t) | {"gate": t(MT.ATTN_GATE)}

    def layer(self, spec: LayerSpec, t: BlockTensors) -> PrePostNormLayer:
        return self.layer_module(spec, self.hp.eps, attn_norm=t(MT.ATTN_NORM), attention=self.mixer(spec, t),
                                 attn_post_norm=t(MT.ATTN_POST_NORM), ffn_norm=t(MT.FFN_NORM),
                                 ffn=self.ffn(spec, t), ffn_post_norm=t(MT.FFN_POST_NORM))


class Afmoe(GatedPrePostNorm, DenseThenSigmoidExperts, DecoderArch):
    neox_rope = True   # llama.cpp rotates this family half the width apart (its converter leaves Q/K as they are)
    swa_period = 4
    honours = DenseThenSigmoidExperts.honours | {Keys.Attention.SLIDING_WINDOW, Keys.Attention.SLIDING_WINDOW_PATTERN}

    def __init__(self, gguf):
        super().__init__(gguf)
        self.embed_scale = math.sqrt(self.hp.hidden)

    def attention_spec(self, i: int) -> AttentionSpec:
        spec = super().attention_spec(i)
        if (i + 1) % NO_ROPE_STEP == 0:
            spec = replace(spec, rope=None)
        windowed = int(self.key(Keys.Attention.SLIDING_WINDOW, 0)) and self.is_sliding(i)   # no window: all global
        return self.sliding(spec) if windowed else spec
