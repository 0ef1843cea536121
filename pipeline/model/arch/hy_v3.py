"""hy_v3 (Hy3): qwen3moe's attention (per-head QK-norm before NeoX RoPE, the whole head rotated:
llama.cpp asserts it); a layer without a router is a dense SwiGLU block, one with a router has experts
routed by the file's gating function (sigmoid where it names none), chosen with a selection bias
named `exp_probs_b` without a `.bias` suffix (the converter's name and the one llama.cpp's loader
asks for), the top-k weights renormalised as the file says and scaled, beside an ungated shared
expert (expert_shared_feed_forward_length wide). The multi-token-prediction blocks after the trunk
(nextn_predict_layers) are not run, as llama.cpp loads and skips them."""
from gguf import MODEL_TENSOR as MT
from gguf import Keys

from .family import FLOAT32_TENSORS, DecoderArch
from .ffn import MLP, MoE
from .hunyuan_moe import WholeHeadRope
from .loading import BlockTensors


class HyV3(WholeHeadRope, DecoderArch):
    neox_rope = True
    fused_gate_up_experts = True   # llama.cpp's loader takes ffn_gate_up_exps too
    float32_tensors = FLOAT32_TENSORS + (".exp_probs_b",)   # the selection bias, without a suffix
    honours = frozenset({Keys.LLM.EXPERT_WEIGHTS_NORM, Keys.LLM.EXPERT_WEIGHTS_SCALE, Keys.LLM.EXPERT_GATING_FUNC})

    def read_gating(self) -> str:
        return self.gating_in_file("sigmoid")   # llama.cpp's default for hy_v3

    def normalizes_expert_weights(self) -> bool:
        return self.weights_norm_in_file()

    def moe(self, i: int, t: BlockTensors) -> MoE:
        # diff: the selection bias is blk.N.exp_probs_b (a `.bias` one llama.cpp leaves unread, and so do
        # we: refused); the shared expert is required (llama.cpp's graph runs it on every expert layer)
        shared = MLP(t(MT.FFN_UP_SHEXP), t(MT.FFN_DOWN_SHEXP), t(MT.FFN_GATE_SHEXP), self.activation)
        return MoE(router=t(MT.FFN_GATE_INP), experts=self.routed_experts(t), act=self.activation,
                   routing=self.routing(i), selection_bias=t(MT.FFN_EXP_PROBS_B, None, required=False),
                   shared=shared)
