"""qwen2: llama with QKV bias (loaded where present) and RoPE pairing half the width apart."""
from .llama import Llama


class Qwen2(Llama):
    neox_rope = True
