"""gemma2 (Gemma 2): Gemma 3's layer (each block between a norm of its input and one of its
output) without its QK-norm; attention logits soft-capped (attn_logit_softcapping, 50 where the
file names none) on a window (the file's, else 4096) on every other layer (the last of each
pair global), with the file's RoPE base for sliding layers (rope.freq_base_swa, else the
base); queries scaled by 1/sqrt(head size), or 1/sqrt(hidden / heads) at the 27B's size (46
layers), as llama.cpp's loader fixes it; GeGLU; embedding scaled by sqrt(hidden); tied output;
final logits soft-capped (30 where the file names none)."""
import math
from dataclasses import replace

import torch
from gguf import Keys

from .blocks import AttentionSpec, SoftCappedAttention
from .family import DecoderArch
from .gemma3 import Gemma3
from .loading import BlockTensors

LAYERS_27B = 46             # llama.cpp scales Gemma-2 27B's queries by 1/sqrt(hidden / heads)
SLIDING_WINDOW = 4096       # llama.cpp's window where the file names none
ATTENTION_CAP, FINAL_CAP = 50.0, 30.0   # llama.cpp's soft caps where the file names none


class Gemma2(Gemma3):
    swa_period = 2
    blockwise_scores = True    # the soft cap is computed outside SDPA
    honours = frozenset({Keys.Attention.SLIDING_WINDOW, Keys.Attention.SLIDING_WINDOW_PATTERN,
                         Keys.LLM.ATTN_LOGIT_SOFTCAPPING, Keys.LLM.FINAL_LOGIT_SOFTCAPPING})

    def attention(self, spec: AttentionSpec, t: BlockTensors) -> SoftCappedAttention:
        cap = float(self.key(Keys.LLM.ATTN_LOGIT_SOFTCAPPING, ATTENTION_CAP))
        return SoftCappedAttention(self.attention_weights(spec, t), spec, self.hp.eps, cap)

    def attention_spec(self, i: int) -> AttentionSpec:
        spec = DecoderArch.attention_spec(self, i)   # diff: sliding layers take the file's sliding RoPE base
        if not self.is_sliding(i):
            return spec
        rope = replace(spec.rope, base=float(self.key(Keys.Rope.FREQ_BASE_SWA, spec.rope.base)))
        return replace(spec, span=int(self.key(Keys.Attention.SLIDING_WINDOW, SLIDING_WINDOW)), rope=rope)

    def attention_scale(self) -> float:
        if self.hp.n_layers == LAYERS_27B:  # diff: llama.cpp's query scale for the 27B
            return 1.0 / math.sqrt(self.hp.hidden / self.hp.n_head)
        return DecoderArch.attention_scale(self)

    def finish_logits(self, logits: torch.Tensor) -> torch.Tensor:
        cap = float(self.key(Keys.LLM.FINAL_LOGIT_SOFTCAPPING, FINAL_CAP))
        return torch.tanh(logits / cap) * cap
