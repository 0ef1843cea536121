"""granite, granitemoe, granitehybrid (Granite 3.x, Granite MoE and MoE-Shared, Granite 4.0-H):
llama's layer with IBM's
multipliers: the embedding scaled by embedding_scale, each block's output by residual_scale
before it joins the stream, Q.K by attention.scale, the logits divided by logit_scale (which
llama.cpp requires); a granitemoe layer's FFN is softmax-routed experts (top-k renormalised)
beside a shared expert where the file has one. A granite file whose rope.scaling.finetuned is
false has no RoPE on any layer, as llama.cpp reads it. One graph for both, llama.cpp's
llm_build_granite. granitehybrid's layers without KV heads mix tokens by Mamba2 (as
nemotron_h's), the others by attention; its logit scale may be left out (logits as they are)."""
from dataclasses import replace

import torch
from gguf import MODEL_TENSOR as MT
from gguf import Keys
from torch import nn

from .blocks import AttentionSpec
from .family import FLOAT32_TENSORS, DecoderArch, LayerSpec
from .loading import BlockTensors
from .modules import Layer
from .ssm import SSM_FLOAT32_TENSORS, read_mamba2

DEEPSTACK_MAPPING = "{arch}.deepstack_mapping"   # Granite 4 Vision's: image features fed into layers


class GraniteLayer(Layer):
    """llama.cpp's llm_build_granite: pre-norm blocks whose outputs are scaled before they join."""

    def describe(self) -> str:
        return f"{super().describe()}, residual scale={self.residual_scale:g}"

    def forward(self, x: torch.Tensor, tables, state: dict | None = None) -> torch.Tensor:
        h = x + self.mixer(self.norm(x, self.attn_norm), tables, state) * self.residual_scale
        return h + self.ffn(self.norm(h, self.ffn_norm)) * self.residual_scale


class Granite(DecoderArch):
    honours = frozenset({Keys.LLM.LOGIT_SCALE, Keys.LLM.RESIDUAL_SCALE, Keys.LLM.EMBEDDING_SCALE})
    logit_scale_default = None   # None: llama.cpp requires the key; 0: logits as they are

    def __init__(self, gguf):
        super().__init__(gguf)
        self.embed_scale = float(self.key(Keys.LLM.EMBEDDING_SCALE, 0.0)) or None   # 0: not set
        self.residual_scale = float(self.key(Keys.LLM.RESIDUAL_SCALE, 0.0)) or 1.0
        # read when the file is opened: a granite file without one is refused before any work
        self.logit_scale = float(self.key(Keys.LLM.LOGIT_SCALE, self.logit_scale_default))

    def settings_not_computed(self) -> dict:
        # image features fed into the trunk are not computed (text runs never have them)
        return super().settings_not_computed() | {DEEPSTACK_MAPPING: lambda v: False}

    def layer(self, spec: LayerSpec, t: BlockTensors) -> GraniteLayer:
        layer = GraniteLayer(spec, self.hp.eps, attn_norm=t(MT.ATTN_NORM), mixer=self.mixer(spec, t),
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
        return logits * (1.0 / self.logit_scale) if self.logit_scale else logits   # diff: divided by logit_scale


class GraniteHybrid(Granite):
    float32_tensors = FLOAT32_TENSORS + SSM_FLOAT32_TENSORS
    logit_scale_default = 0.0    # diff: its logit scale may be left out

    def layer_spec(self, i: int) -> LayerSpec:
        if self.layer_key(Keys.Attention.HEAD_COUNT_KV, i) == 0:
            return LayerSpec(i, "mamba2", self.ffn_kind(i))
        return super().layer_spec(i)

    def mixer(self, spec: LayerSpec, t: BlockTensors) -> nn.Module:
        return read_mamba2(self, t) if spec.mixer == "mamba2" else super().mixer(spec, t)
