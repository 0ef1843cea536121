"""qwen3next, qwen35, qwen35moe: hybrids of Gated DeltaNet layers and gated full attention
(Q's projection carries a sigmoid output gate, partial NeoX RoPE, QK-norm).

Each layer: x + mixer(attn_norm(x)), then h + ffn(post_attention_norm(h)). The FFN is a
softmax-routed MoE with a sigmoid-gated shared expert (qwen3next, qwen35moe) or a dense SwiGLU
(qwen35). Which layers are recurrent comes from `attention.recurrent_layers`, else from
`full_attention_interval` (every n-th layer attends). Qwen3.5 files store text positions for
multi-axis RoPE; with one position per token it reduces to plain NeoX RoPE.
"""
import numpy as np
from gguf import MODEL_TENSOR as T
from gguf import Keys

from .base import BlockTensors, DecoderArch, Residual
from .delta_net import GatedDeltaNet

RECURRENT_LAYERS = getattr(Keys.Attention, "RECURRENT_LAYERS", "{arch}.attention.recurrent_layers")
FULL_ATTENTION_INTERVAL = 4   # llama.cpp's default when the file names neither


class Qwen3Next(DecoderArch):
    neox_rope = True
    tiled_value_heads = False   # value head j reads key head j // (n_v / n_k)

    def is_recurrent(self, i: int) -> bool:
        flags = self.gguf.arch_value(RECURRENT_LAYERS)
        if isinstance(flags, np.ndarray):
            return bool(flags[i])
        return (i + 1) % int(self.key(Keys.LLM.FULL_ATTENTION_INTERVAL, FULL_ATTENTION_INTERVAL)) != 0

    def layer_steps(self, i: int, t: BlockTensors) -> list[Residual]:
        mixer = self.delta_net(t) if self.is_recurrent(i) else self.attention(i, t, gated=True)
        return [Residual(t(T.ATTN_NORM), mixer, self.hp.eps),
                Residual(t(T.ATTN_POST_NORM), self.ffn(i, t), self.hp.eps)]

    def delta_net(self, t: BlockTensors) -> GatedDeltaNet:
        w = {"qkv": t(T.ATTN_QKV), "gate": t(T.ATTN_GATE), "conv": t(T.SSM_CONV1D),
             "dt_bias": t(T.SSM_DT, "bias"), "A": t(T.SSM_A, None), "norm": t(T.SSM_NORM), "out": t(T.SSM_OUT)}
        if t.has(T.SSM_BETA_ALPHA):
            w["beta_alpha"] = t(T.SSM_BETA_ALPHA)
        else:
            w["beta"], w["alpha"] = t(T.SSM_BETA), t(T.SSM_ALPHA)
        return GatedDeltaNet(w, n_k=int(self.key(Keys.SSM.GROUP_COUNT)), n_v=int(self.key(Keys.SSM.TIME_STEP_RANK)),
                             d_k=int(self.key(Keys.SSM.STATE_SIZE)), eps=self.hp.eps, tiled=self.tiled_value_heads)


class Qwen35(Qwen3Next):
    tiled_value_heads = True    # the converter reorders value heads so that head j reads key head j % n_k
