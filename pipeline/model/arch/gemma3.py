"""gemma3: sliding-window layers with their own RoPE base between global layers, QK-norm,
post-attention and post-FFN norms, GeGLU, embedding scaled by sqrt(hidden), tied output.

The GGUF converter already stores Gemma's norm weights as (1 + w).
"""
import math
from dataclasses import replace

import numpy as np
import torch.nn.functional as F
from gguf import Keys

from .base import DecoderArch
from .blocks import RopeSpec

SWA_PATTERN = 6            # every sixth layer attends globally (llama.cpp and transformers agree)
SWA_ROPE_BASE = 10000.0    # sliding layers' RoPE base when the file has no freq_base_swa


class Gemma3(DecoderArch):
    neox_rope = True
    activation = staticmethod(lambda x: F.gelu(x, approximate="tanh"))

    def __init__(self, gguf):
        super().__init__(gguf)
        self.embed_scale = math.sqrt(self.hp.hidden)

    def is_sliding(self, layer: int) -> bool:
        pattern = self.gguf.arch_value(Keys.Attention.SLIDING_WINDOW_PATTERN)
        if isinstance(pattern, np.ndarray):
            return bool(pattern[layer])
        return (layer + 1) % SWA_PATTERN != 0

    def attention_window(self, layer: int) -> int | None:
        return int(self.key(Keys.Attention.SLIDING_WINDOW)) if self.is_sliding(layer) else None

    def rope_spec(self, layer: int) -> RopeSpec:
        spec = super().rope_spec(layer)
        if self.is_sliding(layer):  # local layers use neither the global base nor its scaling
            return replace(spec, base=float(self.key(Keys.Rope.FREQ_BASE_SWA, SWA_ROPE_BASE)), scale=1.0)
        return spec
