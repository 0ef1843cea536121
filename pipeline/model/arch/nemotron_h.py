"""nemotron_h / nemotron_h_moe: one op per layer behind one RMSNorm and a residual: a Mamba2
mixer (no attention heads and no FFN listed for the layer), attention without position encoding
(no FFN listed), or a feed-forward block: a squared-ReLU MLP, or sigmoid-routed squared-ReLU
experts with a selection bias and a shared expert (nemotron_h_moe)."""
from dataclasses import replace

from gguf import MODEL_TENSOR as MT
from gguf import Keys
from torch import nn

from .blocks import AttentionSpec
from .family import FLOAT32_TENSORS, DecoderArch, LayerSpec
from .ffn import relu2
from .loading import BlockTensors
from .modules import OneBlockLayer
from .ssm import SSM_FLOAT32_TENSORS, read_mamba2


class NemotronH(DecoderArch):
    numerics = 2            # 2: Mamba2's scan as group GEMMs (ssm.ssd_blockwise), rounding otherwise
    activation = staticmethod(relu2)
    expert_gating = "sigmoid"
    honours = frozenset({Keys.LLM.EXPERT_WEIGHTS_NORM, Keys.LLM.EXPERT_WEIGHTS_SCALE})
    float32_tensors = FLOAT32_TENSORS + SSM_FLOAT32_TENSORS

    def rms_eps(self) -> float:
        # llama.cpp falls back on the plain layer-norm epsilon
        return float(self.gguf.arch_value(Keys.Attention.LAYERNORM_RMS_EPS) or self.key(Keys.Attention.LAYERNORM_EPS))

    def layer_spec(self, i: int) -> LayerSpec:
        has_ffn = self.layer_key(Keys.LLM.FEED_FORWARD_LENGTH, i) != 0
        if has_ffn:
            return LayerSpec(i, "", self.ffn_kind(i))
        if self.layer_key(Keys.Attention.HEAD_COUNT_KV, i) == 0:
            return LayerSpec(i, "mamba2", "")
        return LayerSpec(i, "attention", "", self.attention_spec(i))

    def attention_spec(self, i: int) -> AttentionSpec:
        return replace(super().attention_spec(i), rope=None)  # diff: no position encoding

    def layer(self, spec: LayerSpec, t: BlockTensors) -> OneBlockLayer:
        op = self.mixer(spec, t) if spec.mixer else self.ffn(spec, t)   # Mamba2, attention or feed-forward
        return OneBlockLayer(spec, self.hp.eps, attn_norm=t(MT.ATTN_NORM), op=op)

    def normalizes_expert_weights(self) -> bool:
        return self.weights_norm_in_file()

    def mixer(self, spec: LayerSpec, t: BlockTensors) -> nn.Module:
        return read_mamba2(self, t) if spec.mixer == "mamba2" else super().mixer(spec, t)
