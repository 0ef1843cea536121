"""lfm2, lfm2moe (LFM2, LFM2-MoE): llama's pre-norm layer whose mixer is a gated short convolution
on the layers with no KV heads (head_count_kv 0) and attention with per-head QK-norm elsewhere
(RoPE half the width apart; a sliding window on every attention layer where the file sets one);
the final norm is `token_embd_norm`. The short convolution (llama.cpp's build_shortconv_block):
in_proj -> B, C, x; a depthwise causal convolution over l_cache taps of B * x, its state zero
at each sequence's start as the other recurrent layers'; C times it; out_proj. lfm2moe: past
the leading dense blocks, experts routed by the file's gating function with a selection bias,
top-k renormalised."""
from dataclasses import replace

import numpy as np
import torch
import torch.nn.functional as F
from gguf import MODEL_TENSOR as MT
from gguf import TENSOR_NAMES, Keys
from torch import nn

from ...errors import UserError
from .blocks import AttentionSpec
from .family import DecoderArch, LayerSpec
from .loading import BlockTensors
from .recurrent import RecurrentMixer
from .ssm import causal_conv1d


class ShortConv(RecurrentMixer):
    """LFM2's gated short convolution: in_proj [3 hidden, hidden], conv [hidden, taps], out_proj."""

    def describe(self) -> str:
        return f"taps={self.w['conv'].shape[1]}"

    def scan(self, x: torch.Tensor, tables=None, state: dict | None = None) -> torch.Tensor:
        # x: [B, T, hidden]
        w = self.w
        b, c, h = F.linear(x, w["in"]).chunk(3, dim=-1)                            # [B, T, hidden] each
        y, conv_state = causal_conv1d(b * h, w["conv"], None, (state or {}).get("conv"))
        if state is not None:
            state["conv"] = conv_state
        return F.linear(c * y, w["out"])


class Lfm2(DecoderArch):
    neox_rope = True
    output_norm = MT.TOKEN_EMBD_NORM
    honours = frozenset({Keys.Attention.SLIDING_WINDOW, Keys.LLM.EXPERT_GATING_FUNC, Keys.LLM.EXPERT_WEIGHTS_SCALE,
                         Keys.LLM.LEADING_DENSE_BLOCK_COUNT})

    def __init__(self, gguf):
        if TENSOR_NAMES[MT.DENSE_2_OUT] + ".weight" in gguf.tensors:
            raise UserError(f"{gguf.path}: an embedding model's dense_2 output projection is not a language model's "
                            f"head; layercycle does not compute it")
        super().__init__(gguf)

    def read_gating(self) -> str:
        return self.gating_in_file("softmax")

    def layer_spec(self, i: int) -> LayerSpec:
        if not int(np.asarray(self.layer_key(Keys.Attention.HEAD_COUNT_KV, i))):
            return LayerSpec(i, "shortconv", self.ffn_kind(i))
        return super().layer_spec(i)

    def attention_spec(self, i: int) -> AttentionSpec:
        span = int(self.gguf.arch_value(Keys.Attention.SLIDING_WINDOW, 0) or 0)   # 0 or none: global
        return replace(super().attention_spec(i), span=span or None)

    def ffn_kind(self, i: int) -> str:
        return self.dense_then_experts(i) if self.has_tensor(i, MT.FFN_GATE_INP) else "mlp"

    def mixer(self, spec: LayerSpec, t: BlockTensors) -> nn.Module:
        if spec.mixer != "shortconv":
            return super().mixer(spec, t)
        return ShortConv({"in": t(MT.SHORTCONV_INPROJ), "conv": t(MT.SHORTCONV_CONV), "out": t(MT.SHORTCONV_OUTPROJ)})
