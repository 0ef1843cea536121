"""gemma3: sliding-window layers with their own RoPE base between global layers, QK-norm,
post-attention and post-FFN norms, GeGLU, embedding scaled by sqrt(hidden), tied output.

The GGUF converter already stores Gemma's norm weights as (1 + w).
"""
import math
from dataclasses import replace

import numpy as np
import torch
import torch.nn.functional as F
from gguf import Keys

from .base import DecoderArch
from .blocks import AttentionSpec

SWA_PATTERN = 6            # every sixth layer attends globally (llama.cpp and transformers agree)
SWA_ROPE_BASE = 10000.0    # sliding layers' RoPE base when the file has no freq_base_swa


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


class Gemma3(DecoderArch):
    neox_rope = True
    activation = staticmethod(gelu_tanh)

    def __init__(self, gguf):
        super().__init__(gguf)
        self.embed_scale = math.sqrt(self.hp.hidden)

    def is_sliding(self, layer: int) -> bool:
        pattern = self.gguf.arch_value(Keys.Attention.SLIDING_WINDOW_PATTERN)
        if isinstance(pattern, np.ndarray):
            return bool(pattern[layer])
        return (layer + 1) % SWA_PATTERN != 0

    def attention_spec(self, i: int) -> AttentionSpec:
        spec = super().attention_spec(i)
        if not self.is_sliding(i):
            return spec
        # local layers attend over the sliding window, with neither the global RoPE base nor its scaling
        rope = replace(spec.rope, base=float(self.key(Keys.Rope.FREQ_BASE_SWA, SWA_ROPE_BASE)), scale=1.0)
        return replace(spec, span=int(self.key(Keys.Attention.SLIDING_WINDOW)), rope=rope)
