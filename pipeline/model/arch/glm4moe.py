"""glm4moe (GLM-4.5, 4.6, 4.7 and -Air): grouped-query attention with Q/K/V biases, optional
QK-norm and partial NeoX RoPE; the post-attention norm is the FFN's pre-norm; leading dense
SwiGLU blocks, then sigmoid-routed experts (selection bias, weight scale, optional groups) beside
a shared expert. Multi-token-prediction blocks after the trunk are not run. GLM-4.6V files
state multi-axis RoPE sections: text positions reduce them to NeoX RoPE with the pairs of the
fourth axis unrotated."""
from gguf import MODEL_TENSOR as MT
from gguf import Keys

from .family import DecoderArch, LayerSpec
from .loading import BlockTensors
from .modules import PreNormLayer


class Glm4Moe(DecoderArch):
    neox_rope = True
    multi_axis_rope = "sections"
    honours = frozenset({Keys.LLM.EXPERT_WEIGHTS_NORM, Keys.LLM.EXPERT_WEIGHTS_SCALE, Keys.LLM.EXPERT_GATING_FUNC,
                         Keys.LLM.LEADING_DENSE_BLOCK_COUNT})

    def layer(self, spec: LayerSpec, t: BlockTensors) -> PreNormLayer:
        # diff: the FFN's pre-norm is stored as the post-attention norm
        return PreNormLayer(spec, self.hp.eps, attn_norm=t(MT.ATTN_NORM), mixer=self.mixer(spec, t),
                            ffn_norm=t(MT.ATTN_POST_NORM), ffn=self.ffn(spec, t))

    def ffn_kind(self, i: int) -> str:
        return self.dense_then_experts(i)

    def normalizes_expert_weights(self) -> bool:
        return self.weights_norm_in_file()

    def read_gating(self) -> str:
        return self.gating_in_file("sigmoid")   # llama.cpp's default for this family
