"""qwen2, qwen3, qwen3moe: llama with RoPE pairing half the width apart; QKV bias (qwen2) and
per-head QK-norm (qwen3) are loaded where the file has them, and a block with a router is a
softmax-routed mixture of experts with renormalised top-k weights (qwen3moe).

qwen3vl, qwen3vlmoe: the text trunk of Qwen3-VL, Qwen3's layers under interleaved multi-axis
RoPE (rope.text_unrotated_pairs: what text positions make of it). The vision tower's deepstack
features are added to the first layers' outputs for image tokens only; for text they are
zero, so `n_deepstack_layers` changes nothing here."""
from .llama import Llama


class Qwen2(Llama):
    neox_rope = True


class Qwen3VL(Qwen2):
    multi_axis_rope = "interleaved"
