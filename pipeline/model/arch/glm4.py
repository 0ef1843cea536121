"""glm4 (GLM-4-0414, GLM-Z1): each block between a norm of its input and one of its output, as
Gemma 3's; attention with QKV bias and partial RoPE on consecutive pairs; a SwiGLU whose gate and
up projections are one `ffn_up` tensor, the gate's rows first. Files with
`rope.dimension_sections` (the GLM-4.1V/4.5V text trunk) rotate text positions by multi-axis
RoPE, as glm4moe's."""
from gguf import MODEL_TENSOR as MT

from .family import DecoderArch, LayerSpec
from .loading import BlockTensors
from .modules import PrePostNormLayer


class Glm4(DecoderArch):
    multi_axis_rope = "sections"
    fused_gate_up_mlp = True

    def layer(self, spec: LayerSpec, t: BlockTensors) -> PrePostNormLayer:
        return PrePostNormLayer(spec, self.hp.eps, attn_norm=t(MT.ATTN_NORM), attention=self.mixer(spec, t),
                                attn_post_norm=t(MT.ATTN_POST_NORM), ffn_norm=t(MT.FFN_NORM),
                                ffn=self.ffn(spec, t), ffn_post_norm=t(MT.FFN_POST_NORM))
