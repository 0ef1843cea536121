"""command-r, cohere2 and cohere2moe (Command R and R+, Command A and R7B, North): attention and
the SwiGLU side by side over one LayerNorm of the stream (mean-subtracted, no bias), both added
to it; RoPE on consecutive pairs; the logits multiplied by logit_scale; tied output behind a
LayerNorm. Command R+ norms Q and K per head with a LayerNorm whose weights differ per head.
cohere2 slides a window (the file's, which llama.cpp requires) over three layers of four (or the
pattern the file lists) and only those take RoPE; its global layers have none. cohere2moe:
cohere2's layers, RMSNorm where the file gives an RMS epsilon, RoPE on the leading dense layers
too, then experts routed by the file's gating function (sigmoid where it names none) beside
shared experts, the two averaged."""
from dataclasses import replace

import torch
from gguf import MODEL_TENSOR as MT
from gguf import Keys

from .blocks import Attention, AttentionSpec, layer_norm, rms_norm
from .family import DecoderArch, DenseThenSigmoidExperts, LayerSpec
from .ffn import ScaledSumMoE
from .loading import BlockTensors
from .modules import Layer


class CohereLayer(Layer):
    """llama.cpp's llm_build_command_r and llm_build_cohere2: one norm, two blocks in parallel."""

    def forward(self, x: torch.Tensor, tables, state=None) -> torch.Tensor:
        h = self.norm(x, self.attn_norm)
        return self.ffn(h) + x + self.attention(h, tables)

    def norm(self, x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        return layer_norm(x, weight, self.eps)


class CohereAttention(Attention):
    """Attention whose per-head QK-norm is a LayerNorm with weights of its own per head [H, D]."""

    def head_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return layer_norm(x, weight, self.eps)


class CommandR(DecoderArch):
    norm = staticmethod(layer_norm)
    honours = frozenset({Keys.LLM.LOGIT_SCALE})

    def __init__(self, gguf):
        super().__init__(gguf)
        self.logit_scale = float(self.key(Keys.LLM.LOGIT_SCALE, 0.0))   # 0 or none: logits as they are

    def rms_eps(self) -> float:
        return float(self.key(Keys.Attention.LAYERNORM_EPS))   # diff: LayerNorm's epsilon

    def layer(self, spec: LayerSpec, t: BlockTensors) -> CohereLayer:
        return CohereLayer(spec, self.hp.eps, attn_norm=t(MT.ATTN_NORM), attention=self.mixer(spec, t),
                           ffn=self.ffn(spec, t))

    def attention(self, spec: AttentionSpec, t: BlockTensors) -> CohereAttention:
        return CohereAttention(self.attention_weights(spec, t), spec, self.hp.eps)

    def qk_norm_shapes(self, a: AttentionSpec) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return (a.n_head, a.key_dim), (a.n_kv, a.key_dim)

    def activation_floats(self, i: int) -> int:
        return super().activation_floats(i) + self.hp.hidden   # diff: the FFN's output held while the attention runs

    def finish_logits(self, logits: torch.Tensor) -> torch.Tensor:
        return logits * self.logit_scale if self.logit_scale else logits


class Cohere2(CommandR):
    swa_period = 4
    honours = CommandR.honours | {Keys.Attention.SLIDING_WINDOW, Keys.Attention.SLIDING_WINDOW_PATTERN}

    def attention_spec(self, i: int) -> AttentionSpec:
        spec = super().attention_spec(i)
        if not self.is_sliding(i):
            return replace(spec, rope=None)   # diff: global layers without position encoding
        return replace(spec, span=int(self.key(Keys.Attention.SLIDING_WINDOW)))


class RmsCohereLayer(CohereLayer):
    """Cohere's parallel layer over an RMSNorm."""

    def norm(self, x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        return rms_norm(x, weight, self.eps)


class AveragedSharedMoE(ScaledSumMoE):
    """Routed experts and the shared ones averaged, (routed + shared) / 2, as llama.cpp's
    cohere2moe graph combines them."""
    sum_scale = 0.5


class Cohere2Moe(DenseThenSigmoidExperts, Cohere2):
    honours = Cohere2.honours | DenseThenSigmoidExperts.honours
    moe_block = AveragedSharedMoE

    def __init__(self, gguf):
        self.rms = gguf.arch_value(Keys.Attention.LAYERNORM_RMS_EPS) is not None   # llama.cpp: RMS where given
        super().__init__(gguf)
        self.norm = rms_norm if self.rms else layer_norm

    def rms_eps(self) -> float:
        return float(self.key(Keys.Attention.LAYERNORM_RMS_EPS)) if self.rms else super().rms_eps()

    def attention_spec(self, i: int) -> AttentionSpec:
        spec = super().attention_spec(i)
        if i < int(self.key(Keys.LLM.LEADING_DENSE_BLOCK_COUNT)):   # diff: the dense prefix rotates, globally
            return replace(spec, rope=self.trunk_rope)
        return spec

    def layer(self, spec: LayerSpec, t: BlockTensors) -> CohereLayer:
        kind = RmsCohereLayer if self.rms else CohereLayer
        return kind(spec, self.hp.eps, attn_norm=t(MT.ATTN_NORM), attention=self.mixer(spec, t), ffn=self.ffn(spec, t))
