"""command-r and cohere2 (Command R and R+, Command A and R7B): attention and the SwiGLU side by
side over one LayerNorm of the stream (mean-subtracted, no bias), both added to it; RoPE on
consecutive pairs; the logits multiplied by logit_scale; tied output behind a LayerNorm.
Command R+ norms Q and K per head with a LayerNorm whose weights differ per head. cohere2 slides
a window (the file's, which llama.cpp requires) over three layers of four (or the pattern the
file lists) and only those take RoPE; its global layers have none."""
from dataclasses import replace

import torch
from gguf import MODEL_TENSOR as MT
from gguf import Keys

from .blocks import Attention, AttentionSpec, layer_norm
from .family import DecoderArch, LayerSpec
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
