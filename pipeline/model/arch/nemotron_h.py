"""nemotron_h / nemotron_h_moe: one op per layer behind one RMSNorm and a residual: a Mamba2
mixer (no attention heads and no FFN listed for the layer), attention without position encoding
(no FFN listed), or a feed-forward block: a squared-ReLU MLP, or sigmoid-routed squared-ReLU
experts with a selection bias and a shared expert (nemotron_h_moe)."""
from gguf import MODEL_TENSOR as T
from gguf import Keys

from .base import BlockTensors, DecoderArch, Residual
from .ffn import relu2
from .ssm import Mamba2


class NemotronH(DecoderArch):
    activation = staticmethod(relu2)
    expert_gating = "sigmoid"

    def rms_eps(self) -> float:
        # llama.cpp falls back on the plain layer-norm epsilon
        return float(self.gguf.arch_value(Keys.Attention.LAYERNORM_RMS_EPS) or self.key(Keys.Attention.LAYERNORM_EPS))

    def rope_spec(self, layer: int):
        return None

    def is_recurrent(self, i: int) -> bool:
        no_kv_heads = self.layer_key(Keys.Attention.HEAD_COUNT_KV, i) == 0
        return no_kv_heads and self.layer_key(Keys.LLM.FEED_FORWARD_LENGTH, i) == 0

    def layer_steps(self, i: int, t: BlockTensors) -> list[Residual]:
        if self.is_recurrent(i):
            op = self.mamba2(t)
        elif self.layer_key(Keys.LLM.FEED_FORWARD_LENGTH, i) == 0:
            op = self.attention(i, t)
        else:
            op = self.ffn(i, t)
        return [Residual(t(T.ATTN_NORM), op, self.hp.eps)]

    def mamba2(self, t: BlockTensors) -> Mamba2:
        w = {"in": t(T.SSM_IN), "conv": t(T.SSM_CONV1D), "conv_bias": t(T.SSM_CONV1D, "bias", required=False),
             "dt_bias": t(T.SSM_DT, "bias"), "A": t(T.SSM_A, None), "D": t(T.SSM_D, None),
             "norm": t(T.SSM_NORM), "out": t(T.SSM_OUT)}
        return Mamba2(w, n_head=int(self.key(Keys.SSM.TIME_STEP_RANK)), n_group=int(self.key(Keys.SSM.GROUP_COUNT)),
                      d_state=int(self.key(Keys.SSM.STATE_SIZE)), eps=self.hp.eps)

    def normalizes_expert_weights(self) -> bool:
        return bool(self.key(Keys.LLM.EXPERT_WEIGHTS_NORM, False))
