"""qwen2, qwen3, qwen3moe: llama with RoPE pairing half the width apart; QKV bias (qwen2) and
per-head QK-norm (qwen3) are loaded where the file has them, and a block with a router is a
softmax-routed mixture of experts with renormalised top-k weights (qwen3moe).

qwen2vl (Qwen2-VL, Qwen2.5-VL): the text trunk, Qwen2's layer (QKV biases) under multi-axis RoPE
in sections (rope.dimension_sections, which llama.cpp's loader requires): text positions make it
NeoX RoPE, a pair ggml puts on the fourth axis unrotated. llama.cpp's qwen2vl loader never reads
layer_norm_rms_epsilon: every RMSNorm of its graph divides by sqrt(mean(x^2) + 0), and so do ours.
It takes Q and O as hidden x hidden, the whole head rotated, a gated MLP, no QK-norm, no attention
output or MLP biases and no rope_freqs; an output bias it loads and leaves unused.

qwen3vl, qwen3vlmoe: the text trunk of Qwen3-VL, Qwen3's layers under interleaved multi-axis
RoPE (rope.text_unrotated_pairs: what text positions make of it). The vision tower's deepstack
features are added to the first layers' outputs for image tokens only; for text they are
zero, so `n_deepstack_layers` changes nothing here.

qwen2moe (Qwen1.5-MoE, Qwen2-57B-A14B): qwen2's attention, and on every layer softmax-routed
experts whose top-k weights are not renormalised (llama.cpp reads no expert_weights_norm for it:
a file that asks for renormalising is refused), beside a shared expert under a sigmoid gate."""
import functools

from gguf import Keys

from ...errors import UserError
from .audit import equals
from .blocks import AttentionSpec
from .hunyuan_moe import WholeHeadRope
from .llama import Llama
from .rope import RopeSpec


class Qwen2(Llama):
    neox_rope = True


class Qwen2VL(WholeHeadRope, Qwen2):
    multi_axis_rope = "sections"
    required_tensors = ("blk.{bid}.ffn_gate.weight",)
    uncomputed_tensors = ("output.bias", "rope_freqs.weight", "blk.{bid}.attn_output.bias",
                          "blk.{bid}.attn_q_norm.weight", "blk.{bid}.attn_k_norm.weight", "blk.{bid}.ffn_up.bias",
                          "blk.{bid}.ffn_down.bias")

    def rms_eps(self) -> float:
        return 0.0   # diff: the file's epsilon unread, as llama.cpp's loader leaves it

    @functools.cached_property
    def trunk_rope(self) -> RopeSpec:
        sections = self.key(Keys.Rope.DIMENSION_SECTIONS)
        if not any(sections[:3]):   # ggml asserts one
            raise UserError(f"{self.gguf.path}: rope.dimension_sections {list(sections)} gives none of the first "
                            f"three axes a pair")
        return super().trunk_rope

    def attention_spec(self, i: int) -> AttentionSpec:
        spec = super().attention_spec(i)
        if spec.n_head * spec.key_dim != self.hp.hidden:
            raise UserError(f"{self.gguf.path}: {spec.n_head} heads of {spec.key_dim}: llama.cpp's qwen2vl loader "
                            f"takes Q and the attention output as embedding_length {self.hp.hidden} wide")
        return spec


class Qwen3VL(Qwen2):
    multi_axis_rope = "interleaved"


class Qwen2Moe(Qwen2):
    def normalizes_expert_weights(self) -> bool:
        return False   # diff: the chosen softmax weights as they are

    def settings_not_computed(self) -> dict:
        return super().settings_not_computed() | {Keys.LLM.EXPERT_WEIGHTS_NORM: equals(False)}
