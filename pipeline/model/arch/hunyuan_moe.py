"""hunyuan-moe (Hunyuan-A13B): grouped-query attention whose queries and keys are rotated (NeoX,
the whole head) and only then RMS-normed per head (QK-norm after RoPE, where qwen3's comes before
it); on every layer the top-k of softmax-routed experts, renormalised, beside an ungated shared
MLP. llama.cpp reads no gating function, weights norm or scale for this family (softmax,
renormalised, unscaled: a file that names others is refused). Its loader sizes the routed experts
by feed_forward_length (not expert_feed_forward_length), the shared MLP by
expert_shared_feed_forward_length (else feed_forward_length), and requires the QK-norms, a router
and the shared MLP on every layer; key_length, value_length and the rotated width must be equal
(llama.cpp asserts it). The converter folds Hunyuan's NTK-alpha RoPE into rope.freq_base."""
from gguf import Keys

from ...errors import UserError
from .blocks import Attention, AttentionSpec, rms_norm
from .family import DecoderArch
from .loading import BlockTensors
from .shapes import expect


class NormAfterRopeAttention(Attention):
    """Attention whose per-head QK-norm (with weights) follows RoPE."""

    def describe(self) -> str:
        return super().describe() + ", QK-norm after RoPE"

    def head_norm(self, x, weight):
        return x   # diff: not before RoPE ...

    def after_rope(self, q, k):
        # ... but here, on the rotated heads q [B, H, T, D], k [B, KV, T, D]
        return rms_norm(q, self.w["q_norm"], self.eps), rms_norm(k, self.w["k_norm"], self.eps)


class WholeHeadRope:
    """llama.cpp asserts key_length == value_length == the rotated width for these graphs (an abort):
    refused by name instead (mixed in before DecoderArch)."""

    def attention_spec(self, i: int) -> AttentionSpec:
        spec = super().attention_spec(i)
        if spec.value_dim != spec.key_dim or spec.rope.dim != spec.key_dim:
            raise UserError(f"{self.gguf.path}: key_length {spec.key_dim}, value_length {spec.value_dim}, rope "
                            f"dimension count {spec.rope.dim}: llama.cpp's {self.gguf.architecture} graph takes "
                            f"them equal (the whole head rotated)")
        return spec


class HunyuanMoe(WholeHeadRope, DecoderArch):
    neox_rope = True

    def __init__(self, gguf):
        super().__init__(gguf)
        self.check_own_shapes()

    def check_own_shapes(self) -> None:
        """What llama.cpp's loader requires beyond shapes.py's checks: experts feed_forward_length wide,
        the shared MLP and the QK-norms on every layer."""
        H = self.hp.hidden
        ff, n_expert = int(self.key(Keys.LLM.FEED_FORWARD_LENGTH)), int(self.key(Keys.LLM.EXPERT_COUNT))
        shared = int(self.key(Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, 0)) or ff
        for i in range(self.hp.n_layers):
            checks = [("ffn_down_exps", (n_expert, H, ff), "expert_count x embedding_length x feed_forward_length"),
                      ("ffn_up_shexp", (shared, H), "the shared MLP's width x embedding_length"),
                      ("ffn_gate_shexp", (shared, H), "the shared MLP's width x embedding_length"),
                      ("ffn_down_shexp", (H, shared), "embedding_length x the shared MLP's width"),
                      ("attn_q_norm", (self.hp.head_dim,), "key_length (the per-head QK-norm)"),
                      ("attn_k_norm", (self.hp.head_dim,), "key_length (the per-head QK-norm)")]
            for kind, shape, why in checks:
                expect(self, f"blk.{i}.{kind}.weight", shape, why, required=True)

    def ffn_kind(self, i: int) -> str:
        return "moe"   # llama.cpp's loader: experts on every layer (a layer without a router: refused)

    def attention(self, spec: AttentionSpec, t: BlockTensors) -> Attention:
        return NormAfterRopeAttention(self.attention_weights(spec, t), spec, self.hp.eps)
