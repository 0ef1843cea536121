"""seed_oss (Seed-OSS): llama's layer with RoPE pairing half the width apart, biases on Q, K and
V (and on the output projection where the file has one), and the FFN's pre-norm stored as the
post-attention norm, as llama.cpp's llm_build_seed_oss reads it."""
from gguf import MODEL_TENSOR as MT

from .family import LayerSpec
from .llama import Llama
from .loading import BlockTensors
from .modules import PreNormLayer


class SeedOss(Llama):
    neox_rope = True

    def layer(self, spec: LayerSpec, t: BlockTensors) -> PreNormLayer:
        # diff: the FFN's pre-norm is stored as the post-attention norm
        return PreNormLayer(spec, self.hp.eps, attn_norm=t(MT.ATTN_NORM), mixer=self.mixer(spec, t),
                            ffn_norm=t(MT.ATTN_POST_NORM), ffn=self.ffn(spec, t))
