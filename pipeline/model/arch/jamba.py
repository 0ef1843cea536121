"""jamba (AI21's Jamba: v0.1, 1.5 and 1.6-1.7, Mini 52B and Large 398B): llama's pre-norm layers
whose token mixer is Mamba-1 where the layer has no KV heads (dt, B and C RMS-normed by weights of
their own) and attention without position encoding where it has some (every eighth layer in the
releases); experts where the layer has a router (every other layer), softmax top-k whose chosen
weights are not renormalised, else a SwiGLU MLP. llama.cpp's loader requires the MLP's gate, the
experts' gates, the mixer's norms and an expansion of two, creates no attention output bias or
QK-norm, and reads no gating function, weights norm or scale for this family: a file that has
them, or lacks the others, is refused."""
from dataclasses import replace

from gguf import MODEL_TENSOR as MT
from gguf import TENSOR_NAMES, Keys

from .audit import equals
from .blocks import AttentionSpec
from .family import DecoderArch, LayerSpec
from .mamba import MambaLayers
from .shapes import expect


class Jamba(MambaLayers, DecoderArch):
    norm_weights = True
    honours = frozenset({Keys.SSM.DT_B_C_RMS})   # its mixers norm dt, B and C whatever the key says
    uncomputed_tensors = ("blk.{bid}.attn_output.bias", "blk.{bid}.attn_q_norm.weight",   # llama.cpp's jamba
                          "blk.{bid}.attn_k_norm.weight")                                  # attention has none

    def __init__(self, gguf):
        super().__init__(gguf)
        self.check_own_shapes()

    def check_own_shapes(self) -> None:
        """What llama.cpp's loader requires beyond shapes.py's checks: the gates, experts and MLPs
        feed_forward_length wide, the attention embedding_length wide."""
        H = self.hp.hidden
        n_expert = int(self.key(Keys.LLM.EXPERT_COUNT, 0))
        for spec in self.specs:
            ff = int(self.layer_key(Keys.LLM.FEED_FORWARD_LENGTH, spec.index))
            checks = {"moe": [(MT.FFN_GATE_EXP, (n_expert, ff, H), "expert_count x feed_forward_length x hidden"),
                              (MT.FFN_DOWN_EXP, (n_expert, H, ff), "expert_count x hidden x feed_forward_length")],
                      "mlp": [(MT.FFN_GATE, (ff, H), "feed_forward_length x hidden"),
                              (MT.FFN_DOWN, (H, ff), "hidden x feed_forward_length")]}[spec.ffn]
            if spec.mixer == "attention":
                checks.append((MT.ATTN_OUT, (H, H), "embedding_length x embedding_length"))
            for kind, shape, why in checks:
                expect(self, TENSOR_NAMES[kind].format(bid=spec.index) + ".weight", shape, why, required=True)

    def settings_not_computed(self) -> dict:
        return super().settings_not_computed() | {Keys.LLM.EXPERT_WEIGHTS_NORM: equals(False)}

    def layer_spec(self, i: int) -> LayerSpec:
        if self.layer_key(Keys.Attention.HEAD_COUNT_KV, i) == 0:
            return LayerSpec(i, "mamba", self.ffn_kind(i))
        return super().layer_spec(i)

    def attention_spec(self, i: int) -> AttentionSpec:
        return replace(super().attention_spec(i), rope=None)   # diff: no position encoding


    def normalizes_expert_weights(self) -> bool:
        return False   # diff: the chosen softmax weights as they are
