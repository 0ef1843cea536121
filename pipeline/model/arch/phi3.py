"""phi3 (Phi-3, Phi-3.5, Phi-4 and Phi-4-mini): llama's layer with Q, K and V in one `attn_qkv`
where the file fuses them, gate and up in one `ffn_up` (the gate's rows first), RoPE half the
width apart over the rotated share of each head; LongRoPE files (`rope_factors_long` and
`rope_factors_short`) divide the frequencies by the long factors when the context per sequence,
rounded up to 256 as llama.cpp rounds it, passes rope.scaling.original_context_length, else by
the short ones, and scale cos and sin by rope.scaling.attn_factor. llama.cpp disables Phi's
sliding window (its loader sets none, whatever the file says), and so do we."""
import functools
from dataclasses import replace

import torch
from gguf import MODEL_TENSOR as MT
from gguf import TENSOR_NAMES, Keys

from ...errors import UserError
from .blocks import AttentionSpec
from .family import DecoderArch
from .loading import read_tensor
from .rope import RopeSpec


class Phi3(DecoderArch):
    neox_rope = True
    fused_gate_up_mlp = True
    honours = frozenset({Keys.Attention.SLIDING_WINDOW})   # read, and computed as llama.cpp does: not at all

    def __init__(self, gguf):
        super().__init__(gguf)
        if TENSOR_NAMES[MT.OUTPUT] + ".bias" in gguf.tensors:
            raise UserError(f"{gguf.path}: an output bias is not part of the phi3 graph layercycle computes")

    def attention_spec(self, i: int) -> AttentionSpec:
        return replace(super().attention_spec(i), rope=self.long_rope)

    @functools.cached_property
    def long_rope(self) -> RopeSpec:
        """The trunk's RoPE, with LongRoPE's two factor sets where the file has them."""
        long, short = (TENSOR_NAMES[kind] + ".weight" for kind in (MT.ROPE_FACTORS_LONG, MT.ROPE_FACTORS_SHORT))
        if long not in self.gguf.tensors:
            return self.trunk_rope
        factors = [tuple(read_tensor(self.gguf, name, "cpu", torch.float32).tolist()) for name in (long, short)]
        after = int(self.key(Keys.Rope.SCALING_ORIG_CTX_LEN, self.hp.context_length))
        return replace(self.trunk_rope, freq_factors=factors[1], long_factors=factors[0], long_after=after)
