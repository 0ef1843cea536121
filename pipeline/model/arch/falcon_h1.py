"""falcon-h1 (Falcon-H1): in every layer attention and a Mamba2 mixer side by side over one RMSNorm
of the stream, their sum added to it, then a SwiGLU behind its own norm; RoPE half the width
apart; the Mamba2 mixer without the grouped norm unless the file has one (mamba_rms_norm); the
FFN's norm is stored as `blk.N.ffn_norm`, without the ".weight" suffix, as llama.cpp reads it. The
converter folds Falcon-H1's multipliers (embedding, attention in and out, key, SSM in, out and
per part of in_proj, MLP, LM head) into the weights, and llama.cpp's llm_build_falcon_h1
computes none of them at run time: neither do we."""
import torch
from gguf import MODEL_TENSOR as MT

from .family import FLOAT32_TENSORS, DecoderArch, LayerSpec
from .loading import BlockTensors
from .modules import Layer
from .ssm import SSM_FLOAT32_TENSORS, read_mamba2


class FalconH1Layer(Layer):
    """llama.cpp's llm_build_falcon_h1: attention and Mamba2 in parallel, then the FFN."""

    def forward(self, x: torch.Tensor, tables, state: dict | None = None) -> torch.Tensor:
        h = self.norm(x, self.attn_norm)
        h = self.attention(h, tables) + self.mamba2(h, tables, state) + x
        return h + self.ffn(self.norm(h, self.ffn_norm))


class FalconH1(DecoderArch):
    neox_rope = True
    float32_tensors = FLOAT32_TENSORS + SSM_FLOAT32_TENSORS

    def layer_spec(self, i: int) -> LayerSpec:
        return LayerSpec(i, "attention+mamba2", "mlp", self.attention_spec(i))

    def layer(self, spec: LayerSpec, t: BlockTensors) -> FalconH1Layer:
        return FalconH1Layer(spec, self.hp.eps, attn_norm=t(MT.ATTN_NORM), attention=self.attention(spec.attention, t),
                             mamba2=read_mamba2(self, t, norm_required=False),
                             ffn_norm=t(MT.FFN_NORM, None), ffn=self.ffn(spec, t))   # diff: named without ".weight"
