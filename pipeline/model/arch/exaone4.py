"""exaone4 (EXAONE 4.0): OLMo 2's layer (each block over the stream, its output normed before it
joins it), per-head QK-norm, RoPE half the width apart (Llama-3 `rope_freqs` where the file has
them). llama.cpp gives the 64-layer size (the 32B) a sliding window (the file's, else 4096) on
three layers of four (or the pattern the file lists), and its global layers no RoPE; any other
size attends globally with RoPE on every layer, whatever window the file names. So do we
(transformers slides wherever the config has a window)."""
from dataclasses import replace

from gguf import MODEL_TENSOR as MT
from gguf import Keys

from .blocks import AttentionSpec
from .family import DecoderArch, LayerSpec
from .loading import BlockTensors
from .modules import PostNormLayer

LAYERS_32B = 64        # the only size llama.cpp's loader gives a sliding window
SLIDING_WINDOW = 4096  # its window where the file names none


class Exaone4(DecoderArch):
    neox_rope = True
    swa_period = 4
    honours = frozenset({Keys.Attention.SLIDING_WINDOW, Keys.Attention.SLIDING_WINDOW_PATTERN})

    def layer(self, spec: LayerSpec, t: BlockTensors) -> PostNormLayer:
        return PostNormLayer(spec, self.hp.eps, attention=self.mixer(spec, t), attn_post_norm=t(MT.ATTN_POST_NORM),
                             ffn=self.ffn(spec, t), ffn_post_norm=t(MT.FFN_POST_NORM))

    def attention_spec(self, i: int) -> AttentionSpec:
        spec = super().attention_spec(i)
        if self.hp.n_layers != LAYERS_32B:
            return spec
        if not self.is_sliding(i):
            return replace(spec, rope=None)   # diff: global layers without position encoding
        return replace(spec, span=int(self.key(Keys.Attention.SLIDING_WINDOW, SLIDING_WINDOW)))
