"""qwen3next, qwen35, qwen35moe: hybrids of Gated DeltaNet layers and gated full attention
(Q's projection carries a sigmoid output gate, partial NeoX RoPE, QK-norm).

Each layer: x + mixer(attn_norm(x)), then h + ffn(post_attention_norm(h)). The FFN is a
softmax-routed MoE with a sigmoid-gated shared expert (qwen3next, qwen35moe) or a dense SwiGLU
(qwen35). Which layers are recurrent comes from `attention.recurrent_layers`, else from
`full_attention_interval` (every n-th layer attends). Qwen3.5 files state interleaved multi-axis
RoPE sections: text positions reduce it to NeoX RoPE with the pairs of its fourth axis unrotated.
"""
from dataclasses import replace

import torch.nn.functional as F
from gguf import MODEL_TENSOR as MT
from gguf import Keys
from torch import nn

from .delta_net import GatedDeltaNet
from .family import FLOAT32_TENSORS, AttentionEveryNth, DecoderArch, LayerSpec
from .loading import BlockTensors
from .modules import PreNormLayer
from .ssm import SSM_FLOAT32_TENSORS


class Qwen3Next(AttentionEveryNth, DecoderArch):
    neox_rope = True
    fused_gate_up_experts = True
    tiled_value_heads = False   # value head j reads key head j // (n_v / n_k)
    float32_tensors = FLOAT32_TENSORS + SSM_FLOAT32_TENSORS   # the delta rule's A and dt bias as Mamba2's
    delta_net_gate = staticmethod(F.silu)    # of the Gated DeltaNet's normed output

    def layer_spec(self, i: int) -> LayerSpec:
        if self.is_recurrent(i):
            return LayerSpec(i, "delta_net", self.ffn_kind(i))
        return LayerSpec(i, "attention", self.ffn_kind(i), replace(self.attention_spec(i), gated=True))

    def layer(self, spec: LayerSpec, t: BlockTensors) -> PreNormLayer:
        # diff: the FFN's pre-norm is stored as the post-attention norm
        return PreNormLayer(spec, self.hp.eps, attn_norm=t(MT.ATTN_NORM), mixer=self.mixer(spec, t),
                            ffn_norm=t(MT.ATTN_POST_NORM), ffn=self.ffn(spec, t))

    def mixer(self, spec: LayerSpec, t: BlockTensors) -> nn.Module:
        return self.delta_net(t) if spec.mixer == "delta_net" else super().mixer(spec, t)

    def delta_net(self, t: BlockTensors) -> GatedDeltaNet:
        w = {"qkv": t(MT.ATTN_QKV), "gate": t(MT.ATTN_GATE), "conv": t(MT.SSM_CONV1D),
             "dt_bias": t(MT.SSM_DT, "bias"), "A": t(MT.SSM_A, None), "norm": t(MT.SSM_NORM), "out": t(MT.SSM_OUT)}
        if t.has(MT.SSM_BETA_ALPHA):
            w["beta_alpha"] = t(MT.SSM_BETA_ALPHA)
        else:
            w["beta"], w["alpha"] = t(MT.SSM_BETA), t(MT.SSM_ALPHA)
        return GatedDeltaNet(w, n_k=int(self.key(Keys.SSM.GROUP_COUNT)), n_v=int(self.key(Keys.SSM.TIME_STEP_RANK)),
                             d_k=int(self.key(Keys.SSM.STATE_SIZE)), eps=self.hp.eps, tiled=self.tiled_value_heads,
                             gate_act=self.delta_net_gate)


class Qwen35(Qwen3Next):
    tiled_value_heads = True    # the converter reorders value heads so that head j reads key head j % n_k
    multi_axis_rope = "interleaved"   # text positions: see rope.text_unrotated_pairs
