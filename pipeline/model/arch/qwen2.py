"""qwen2, qwen3, qwen3moe: llama with RoPE pairing half the width apart; QKV bias (qwen2) and
per-head QK-norm (qwen3) are loaded where the file has them, and a block with a router is a
softmax-routed mixture of experts with renormalised top-k weights (qwen3moe)."""
from .llama import Llama


class Qwen2(Llama):
    neox_rope = True
