"""muse-glimmer (Muse Glimmer 30B's text trunk): Gemma 3's layer, each block between an RMSNorm of its
input and one of its output (the converter stores the four norms' 1 + w), the output norms at eps
1e-8 (llama.cpp's graph fixes it, the file names none); the embedding RMS-normed without a weight;
attention with a per-head QK-norm whose weights the converter writes (the queries' filled with
qk_scale_factor, the keys' ones), a sigmoid gate per value of its own (`attn_gate`, of the normed
input) on the heads' outputs, RoPE on consecutive pairs on the sliding layers only (the file's window
on three layers of four, or its pattern) at rope.freq_base_swa where the file has one, the global
layers without RoPE; a SwiGLU MLP; the logits multiplied by logit_scale, then soft-capped where the
file sets final_logit_softcapping.

As llama.cpp's loader reads it: the window and logit_scale required, an LM head of its own, the
QK-norms and the MLP's gate on every layer; values as wide as keys (its graph asserts it). Its
sliding layers rotate at the swa frequency scale, which it never reads from the file, with no
`rope_freqs` (it loads none): a file with RoPE scaling or `rope_freqs` is refused, as one with an
attention output bias or dense biases (its loader has none). (transformers takes the global layers
from layer_rope_theta's zeros and the output norms' eps from post_norm_eps: as published, the same.)"""
from dataclasses import replace

import torch
from gguf import Keys

from ...errors import UserError
from .afmoe import GatedPrePostNorm
from .blocks import AttentionSpec, rms_norm
from .family import DecoderArch
from .modules import PrePostNormLayer
from .shapes import expect

POST_NORM_EPS = 1e-8   # llama.cpp's eps for the blocks' output norms


class FinePostNormLayer(PrePostNormLayer):
    """Gemma 3's layer whose output norms take an eps of their own (POST_NORM_EPS)."""

    def post_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, weight, POST_NORM_EPS)


class MuseGlimmer(GatedPrePostNorm, DecoderArch):
    layer_module = FinePostNormLayer
    swa_period = 4
    own_head_required = True
    uncomputed_tensors = ("blk.{bid}.attn_output.bias", "blk.{bid}.ffn_up.bias", "blk.{bid}.ffn_down.bias")
    honours = frozenset({Keys.Attention.SLIDING_WINDOW, Keys.Attention.SLIDING_WINDOW_PATTERN, Keys.LLM.LOGIT_SCALE,
                         Keys.LLM.FINAL_LOGIT_SOFTCAPPING})

    def __init__(self, gguf):
        super().__init__(gguf)
        rope, H, D = self.trunk_rope, self.hp.hidden, self.hp.head_dim
        if rope.yarn is not None or rope.scale != 1.0 or rope.freq_factors:
            raise UserError(f"{gguf.path}: RoPE scaling (or rope_freqs) is not computed by layercycle for "
                            f"muse-glimmer (llama.cpp rotates its sliding layers unscaled)")
        self.key(Keys.Attention.SLIDING_WINDOW)   # required by llama.cpp's loader, whatever the pattern
        self.logit_scale = float(self.key(Keys.LLM.LOGIT_SCALE))
        self.cap = float(self.key(Keys.LLM.FINAL_LOGIT_SOFTCAPPING, 0.0))   # 0: no cap
        for spec in self.specs:   # optional in the layers this one reuses, required by llama.cpp's loader
            i, a = spec.index, spec.attention
            checks = [("attn_q_norm", (D,), "key_length (the per-head QK-norm)"),
                      ("attn_k_norm", (D,), "key_length (the per-head QK-norm)"),
                      ("attn_gate", (a.n_head * D, H), "head_count x key_length x embedding_length"),
                      ("ffn_gate", gguf.tensors[f"blk.{i}.ffn_up.weight"].shape, "the up projection's shape")]
            for kind, shape, why in checks:
                expect(self, f"blk.{i}.{kind}.weight", shape, why, required=True)

    def attention_spec(self, i: int) -> AttentionSpec:
        spec = super().attention_spec(i)
        if spec.value_dim != spec.key_dim:
            raise UserError(f"{self.gguf.path}: value_length {spec.value_dim} is not key_length {spec.key_dim} "
                            f"(llama.cpp's muse-glimmer graph takes them equal)")
        if not self.is_sliding(i):
            return replace(spec, rope=None)   # diff: global layers without position encoding
        return self.sliding(spec)   # the file's window and sliding RoPE base (else the trunk's)

    def activation_floats(self, i: int) -> int:
        # diff: the gate beside the heads' outputs and their product (measured at hidden 2048: the peak
        # without it within 0.2% of the count)
        return super().activation_floats(i) + self.specs[i].attention.n_head * self.hp.head_dim

    def embed(self, ids: torch.Tensor, device, dtype) -> torch.Tensor:
        return rms_norm(super().embed(ids, device, dtype), None, self.hp.eps)   # diff: the embedding normed

    def finish_logits(self, logits: torch.Tensor) -> torch.Tensor:
        logits = logits * self.logit_scale
        return logits if not self.cap else torch.tanh(logits / self.cap) * self.cap
