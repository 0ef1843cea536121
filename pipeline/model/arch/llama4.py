"""llama4 (Llama 4 Scout and Maverick): llama's layers, where every fourth layer has no RoPE (and
its queries take the attention temperature), the others a weightless RMS norm of Q and K after
RoPE (not in Maverick, 128 experts) and chunked attention over 8192-token chunks, except every
fourth layer (llama.cpp's fixed chunk, whatever the file says); every `interleave_moe_layer_step`-th
layer a mixture of experts routed by sigmoid over the top-k (one) whose weight scales the
expert's input, beside a shared expert. A file with sliding_window 0 has neither chunks nor the
temperature, and only its last layer goes without RoPE, as llama.cpp reads it."""
from dataclasses import replace

from gguf import Keys

from .blocks import AttentionSpec, Temperature
from .llama import Llama

CHUNK = 8192                                    # llama.cpp's chunked-attention span
TEMPERATURE = Temperature(0.1, 8192, 1.0)       # llama.cpp's fixed attention temperature
NOPE_PERIOD = 4
MAVERICK_EXPERTS = 128                          # llama.cpp computes no QK-norm for this size


class Llama4(Llama):
    expert_gating = "sigmoid"
    weight_before_experts = True
    swa_period = 4
    honours = frozenset({Keys.Attention.SLIDING_WINDOW, Keys.Attention.SLIDING_WINDOW_PATTERN,
                         Keys.LLM.EXPERT_WEIGHTS_NORM})

    def chunked(self) -> bool:
        window = self.gguf.arch_value(Keys.Attention.SLIDING_WINDOW)
        return window is None or int(window) != 0

    def uses_rope(self, i: int) -> bool:
        period = NOPE_PERIOD if self.chunked() else self.hp.n_layers
        return (i + 1) % period != 0

    def ffn_kind(self, i: int) -> str:
        step = int(self.key(Keys.LLM.INTERLEAVE_MOE_LAYER_STEP))
        return "moe" if step > 0 and (i + 1) % step == 0 else "mlp"

    def attention_spec(self, i: int) -> AttentionSpec:
        spec, chunked = super().attention_spec(i), self.chunked()
        if not self.uses_rope(i):
            return replace(spec, rope=None, temperature=TEMPERATURE if chunked else None)
        return replace(spec, chunk=CHUNK if chunked and self.is_sliding(i) else None,
                       unit_qk_norm=int(self.key(Keys.LLM.EXPERT_COUNT)) != MAVERICK_EXPERTS)

    def normalizes_expert_weights(self) -> bool:
        return False
