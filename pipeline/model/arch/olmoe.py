"""olmoe (OLMoE): llama's layer with Q and K RMS-normed over all heads at once, RoPE half the width
apart, and on every layer softmax-routed experts whose top-k weights are not renormalised, as
qwen2moe's (without a shared expert)."""
from dataclasses import replace

from .blocks import AttentionSpec
from .qwen2 import Qwen2Moe


class Olmoe(Qwen2Moe):
    def attention_spec(self, i: int) -> AttentionSpec:
        return replace(super().attention_spec(i), qk_norm_across_heads=True)   # diff: QK-norm over all heads
