"""smollm3 (SmolLM3): llama's layers, where every fourth layer has no RoPE (NoPE). llama.cpp
fixes the period at 4 whatever the checkpoint's `no_rope_layers` said (the converter writes no
key for it), and so do we."""
from dataclasses import replace

from .blocks import AttentionSpec
from .llama import Llama

NOPE_PERIOD = 4   # llama.cpp's n_no_rope_layer_step for this family


class SmolLM3(Llama):
    def attention_spec(self, i: int) -> AttentionSpec:
        spec = super().attention_spec(i)
        return spec if (i + 1) % NOPE_PERIOD else replace(spec, rope=None)   # diff: NoPE layers
