"""granite, granitemoe (Granite 3.x, Granite MoE and MoE-Shared): llama's layer with IBM's
multipliers: the embedding scaled by embedding_scale, each block's output by residual_scale
before it joins the stream, Q.K by attention.scale, the logits divided by logit_scale (which
llama.cpp requires); a granitemoe layer's FFN is softmax-routed experts (top-k renormalised)
beside a shared expert where the file has one. A granite file whose rope.scaling.finetuned is
false has no RoPE on any layer, as llama.cpp reads it. One graph for both, llama.cpp's
llm_build_granite."""
from dataclasses import replace

import torch
from gguf import MODEL_TENSOR as MT
from gguf import Keys

from .blocks import AttentionSpec
from .family import DecoderArch, LayerSpec
from .loading import BlockTensors
from .modules import Layer

DEEPSTACK_MAPPING = "{arch}.deepstack_mapping"   # Granite 4 Vision's: image features fed into layers


class GraniteLayer(Layer):
    """llama.cpp's llm_build_granite: pre-norm blocks whose outputs are scaled before they join."""

    def forward(self, x: torch.Tensor, tables, state=None) -> torch.Tensor:
        h = x + self.attention(self.norm(x, self.attn_norm), tables) * self.residual_scale
        return h + self.ffn(self.norm(h, self.ffn_norm)) * self.residual_scale


class Granite(DecoderArch):
    honours = frozenset({Keys.LLM.LOGIT_SCALE, Keys.LLM.RESIDUAL_SCALE, Keys.LLM.EMBEDDING_SCALE})

    def __init__(self, gguf):
        super().__init__(gguf)
        self.embed_scale = float(self.key(Keys.LLM.EMBEDDING_SCALE, 0.0)) or None   # 0: not set
        self.residual_scale = float(self.key(Keys.LLM.RESIDUAL_SCALE, 0.0)) or 1.0

    def settings_not_computed(self) -> dict:
        # image features fed into the trunk are not computed (text runs never have them)
        return super().settings_not_computed() | {DEEPSTACK_MAPPING: lambda v: False}

    def layer(self, spec: LayerSpec, t: BlockTensors) -> GraniteLayer:
        layer = GraniteLayer(spec, self.hp.eps, attn_norm=t(MT.ATTN_NORM), attention=self.mixer(spec, t),
                             ffn_norm=t(MT.FFN_NORM), ffn=self.ffn(spec, t))
        layer.residual_scale = self.residual_scale
        return layer

    def attention_scale(self) -> float:
        return float(self.key(Keys.Attention.SCALE, 0.0)) or super().attention_scale()

    def attention_spec(self, i: int) -> AttentionSpec:
        spec = super().attention_spec(i)
        finetuned = self.gguf.arch_value(Keys.Rope.SCALING_FINETUNED)
        return spec if finetuned is None or bool(finetuned) else replace(spec, rope=None)

    def finish_logits(self, logits: torch.Tensor) -> torch.Tensor:
        return logits * (1.0 / float(self.key(Keys.LLM.LOGIT_SCALE)))   # diff: divided by logit_scale
