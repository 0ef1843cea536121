"""minimax-m2 (MiniMax-M2): attention whose QK-norm runs over all heads' queries (and keys) at
once, before the head split; partial NeoX RoPE; every layer a mixture of experts routed by
sigmoid with a selection bias (expert_gating_func, which llama.cpp requires), top-k weights
renormalised."""
from dataclasses import replace

from gguf import Keys

from .blocks import AttentionSpec
from .family import DecoderArch


class MinimaxM2(DecoderArch):
    neox_rope = True
    honours = frozenset({Keys.LLM.EXPERT_GATING_FUNC})

    def read_gating(self) -> str:
        return self.gating_in_file(None)

    def attention_spec(self, i: int) -> AttentionSpec:
        return replace(super().attention_spec(i), qk_norm_across_heads=True)
