"""qwen2, qwen3, qwen3moe: llama with RoPE pairing half the width apart; QKV bias (qwen2) and
per-head QK-norm (qwen3) are loaded where the file has them, and a block with a router is a
softmax-routed mixture of experts with renormalised top-k weights (qwen3moe).

qwen3vl, qwen3vlmoe: the text trunk of Qwen3-VL, Qwen3's layers under interleaved multi-axis
RoPE (rope.text_unrotated_pairs: what text positions make of it). The vision tower's deepstack
features are added to the first layers' outputs for image tokens only; for text they are
zero, so `n_deepstack_layers` changes nothing here.

qwen2moe (Qwen1.5-MoE, Qwen2-57B-A14B): qwen2's attention, and on every layer softmax-routed
experts whose top-k weights are not renormalised (llama.cpp reads no expert_weights_norm for it:
a file that asks for renormalising is refused), beside a shared expert under a sigmoid gate."""
from gguf import Keys

from .audit import equals
from .llama import Llama


class Qwen2(Llama):
    neox_rope = True


class Qwen3VL(Qwen2):
    multi_axis_rope = "interleaved"


class Qwen2Moe(Qwen2):
    def normalizes_expert_weights(self) -> bool:
        return False   # diff: the chosen softmax weights as they are

    def settings_not_computed(self) -> dict:
        return super().settings_not_computed() | {Keys.LLM.EXPERT_WEIGHTS_NORM: equals(False)}
