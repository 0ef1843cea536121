"""exaone-moe (K-EXAONE 236B-A23B): llama's pre-norm layer, each head's Q and K RMS-normed; a sliding
window (the file's) on three layers of four, or the pattern the file lists, whose layers rotate half
the width apart at the trunk's RoPE base (`rope_freqs` where the file has them; llama.cpp's loader
reads rope.freq_base_swa, its graph never uses it), the global layers without RoPE; leading dense
SwiGLU blocks, then experts routed by the file's gating function with a selection bias, groups,
the file's weight norm and scale, beside an ungated shared MLP (expert_shared_feed_forward_length
wide, else the experts' width). The multi-token-prediction blocks after the trunk
(nextn_predict_layers) are not run, as llama.cpp loads and skips them.

As llama.cpp's loader reads it: the window and the gating function required, an LM head of its
own, the QK-norms, the dense gate, the experts' gate and the shared MLP on every layer that has
them, the experts expert_feed_forward_length wide (the first layer's value for all); key_length,
value_length and the rotated width equal (its graph asserts it). It loads no attention output
bias, dense biases or shared-expert gate: a file with one is refused."""
from dataclasses import replace

from gguf import Keys

from .blocks import AttentionSpec
from .family import DecoderArch, DenseThenSigmoidExperts
from .hunyuan_moe import WholeHeadRope
from .shapes import expect


class ExaoneMoe(WholeHeadRope, DenseThenSigmoidExperts, DecoderArch):
    neox_rope = True
    swa_period = 4
    own_head_required = True
    uncomputed_tensors = ("blk.{bid}.attn_output.bias", "blk.{bid}.ffn_up.bias", "blk.{bid}.ffn_down.bias",
                          "blk.{bid}.ffn_gate_inp_shexp.weight")
    honours = DenseThenSigmoidExperts.honours | {Keys.Attention.SLIDING_WINDOW, Keys.Attention.SLIDING_WINDOW_PATTERN}

    def __init__(self, gguf):
        super().__init__(gguf)
        self.check_own_shapes()

    def read_gating(self) -> str:
        return self.gating_in_file(None)   # llama.cpp's loader stops on a file that names none

    def attention_spec(self, i: int) -> AttentionSpec:
        spec = super().attention_spec(i)
        span = int(self.key(Keys.Attention.SLIDING_WINDOW))   # required by llama.cpp's loader, whatever the pattern
        if not self.is_sliding(i):
            return replace(spec, rope=None)   # diff: global layers without position encoding
        return replace(spec, span=span)

    def check_own_shapes(self) -> None:
        """What llama.cpp's loader requires beyond shapes.py's checks."""
        H, D, tensors = self.hp.hidden, self.hp.head_dim, self.gguf.tensors
        n_expert = int(self.key(Keys.LLM.EXPERT_COUNT, 0))
        ff = int(self.layer_key(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, 0))   # layer 0's sizes every layer's experts
        shared = int(self.key(Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, 0)) or ff
        for spec in self.specs:
            i = spec.index
            checks = [("attn_q_norm", (D,), "key_length (the per-head QK-norm)"),
                      ("attn_k_norm", (D,), "key_length (the per-head QK-norm)")]
            if spec.ffn == "mlp":
                checks += [("ffn_gate", (tensors[f"blk.{i}.ffn_up.weight"].shape[0], H), "the up projection's shape")]
            else:
                checks += [("ffn_gate_exps", (n_expert, ff, H), "expert_count x expert_feed_forward_length x "
                            "embedding_length"),
                           ("ffn_down_exps", (n_expert, H, ff), "expert_count x embedding_length x "
                            "expert_feed_forward_length"),
                           ("ffn_up_shexp", (shared, H), "the shared MLP's width x embedding_length"),
                           ("ffn_gate_shexp", (shared, H), "the shared MLP's width x embedding_length"),
                           ("ffn_down_shexp", (H, shared), "embedding_length x the shared MLP's width")]
            for kind, shape, why in checks:
                expect(self, f"blk.{i}.{kind}.weight", shape, why, required=True)
