"""llama: RMSNorm, SwiGLU, RoPE on consecutive pairs (the GGUF converter permutes Q/K for it),
optional Llama-3 `rope_freqs` frequency factors (read by the base class); Mixtral-style files
are llama with a router and expert tensors in each block (softmax, renormalised top-k)."""
from .family import DecoderArch


class Llama(DecoderArch):
    neox_rope = False
