"""step35 (Step-3.5-Flash; the text trunk of Step-3.7-Flash): llama's pre-norm layer with per-head
QK-norm, RoPE half the width apart and a sigmoid gate per head on the heads' outputs (`attn_gate`);
sliding-window layers (the file's per-layer pattern) with their own head count, RoPE base and
rotated width, the others global; experts routed by the file's gating function (sigmoid where it
names none) with a selection bias, the file's weight norm and scale, beside a shared expert.

As llama.cpp's graph defines it: a global layer rotates half of `rope.dimension_count` (its
loader halves it for this architecture), with `rope_freqs` where the file has them; a sliding
layer rotates `rope.dimension_count_swa` (else the whole `rope.dimension_count`), without them.
Where the file gives a layer a SwiGLU limit (`swiglu_clamp_exp` for its experts,
`swiglu_clamp_shexp` for its shared or dense MLP), silu(gate) is clamped above at it and the up
projection to +-limit.
"""
import functools
from dataclasses import replace

import torch
from gguf import MODEL_TENSOR as MT
from gguf import Keys

from .blocks import AttentionSpec
from .family import DecoderArch, DenseThenSigmoidExperts
from .ffn import swiglu_limited
from .loading import BlockTensors
from .shapes import expect

ROPE_DIMENSION_COUNT_SWA = "{arch}.rope.dimension_count_swa"
LIMIT_EPS = 1e-6   # llama.cpp's: a limit at or below it means none


class Step35(DenseThenSigmoidExperts, DecoderArch):
    neox_rope = True
    honours = DenseThenSigmoidExperts.honours | {
        Keys.Attention.SLIDING_WINDOW, Keys.Attention.SLIDING_WINDOW_PATTERN, Keys.LLM.SWIGLU_CLAMP_EXP,
        Keys.LLM.SWIGLU_CLAMP_SHEXP}

    def __init__(self, gguf):
        super().__init__(gguf)
        for spec in self.specs:
            a = spec.attention
            expect(self, f"blk.{spec.index}.attn_gate.weight", (a.n_head, self.hp.hidden), "heads x embedding_length")

    def ffn_kind(self, i: int) -> str:
        return DecoderArch.ffn_kind(self, i)   # llama.cpp's graph: experts where the layer has a router

    def attention_spec(self, i: int) -> AttentionSpec:
        spec, rope = super().attention_spec(i), self.trunk_rope
        if self.is_sliding(i):
            dim = int(self.key(ROPE_DIMENSION_COUNT_SWA, rope.dim))
            return self.sliding(replace(spec, rope=replace(rope, dim=dim, freq_factors=None)))
        factors = rope.freq_factors and rope.freq_factors[:rope.dim // 4]
        return replace(spec, rope=replace(rope, dim=rope.dim // 2, freq_factors=factors))

    def attention_weights(self, spec: AttentionSpec, t: BlockTensors) -> dict[str, torch.Tensor | None]:
        return super().attention_weights(spec, t) | {"gate": t(MT.ATTN_GATE, required=False)}

    def gated_unit(self, i: int, shared: bool = False):
        limit = float(self.layer_key(Keys.LLM.SWIGLU_CLAMP_SHEXP if shared else Keys.LLM.SWIGLU_CLAMP_EXP, i, 0.0))
        return functools.partial(swiglu_limited, limit=limit) if limit > LIMIT_EPS else None
