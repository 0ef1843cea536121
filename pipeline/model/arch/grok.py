"""grok (Grok-1 314B, Grok-2 270B): each block between an RMSNorm of its input and one of its
output (Gemma 3's layer); grouped-query attention, RoPE half the head apart over all of it, Q.K
scaled by attention.output_scale and soft-capped (attn_logit_softcapping) before the softmax;
softmax top-k experts renormalised, GELU-gated (tanh form); Grok-2's dense GELU MLP beside them
(where the file has ffn_up), the two summed and scaled by sqrt(2) / 2; the embedding scaled by
embedding_scale, the logits by logit_scale, then soft-capped where final_logit_softcapping is set;
YaRN with the file's correction-dim betas (beta_fast 8 where it names none). A key the file leaves
out takes llama.cpp's Grok-1 default. llama.cpp reads router_logit_softcapping and
attention.temperature_length and its graph applies neither: neither does layercycle."""
import math

import torch
from gguf import MODEL_TENSOR as MT
from gguf import TENSOR_NAMES, Keys

from ...errors import UserError
from .blocks import AttentionSpec, SoftCappedAttention
from .family import DecoderArch, LayerSpec
from .ffn import MLP, ScaledSumMoE
from .gemma3 import gelu_tanh
from .loading import BlockTensors
from .modules import PrePostNormLayer
from .shapes import expect

# llama.cpp's defaults for files that leave the key out (Grok-1's values)
LOGIT_SCALE, EMBEDDING_SCALE, ATTENTION_SCALE = 0.5773502691896257, 78.38367176906169, 0.08838834764831845
ATTENTION_CAP, YARN_BETA_FAST, YARN_BETA_SLOW = 30.0, 8.0, 1.0


class UnfusedSoftCappedAttention(SoftCappedAttention):
    """Grok's soft-capped attention: llama.cpp forces its flash attention off for this architecture
    (llama-context.cpp), so that in llama-cpp numerics its queries and softmax weights are rounded."""
    flash = False


class ResidualMoE(ScaledSumMoE):
    """Grok-2's experts beside a dense MLP (the `shared` block), their sum scaled by sqrt(2) / 2."""
    sum_scale = math.sqrt(2) / 2


class Grok(DecoderArch):
    neox_rope = True
    activation = staticmethod(gelu_tanh)
    blockwise_scores = True    # the soft cap is computed outside SDPA
    optional_attention = ("q_bias", "k_bias", "v_bias")   # llama.cpp's loader: no output bias, no QK-norm
    # router_logit_softcapping: read by llama.cpp's loader, applied by no graph of it
    honours = frozenset({Keys.LLM.LOGIT_SCALE, Keys.LLM.EMBEDDING_SCALE, Keys.Attention.OUTPUT_SCALE,
                         Keys.LLM.ATTN_LOGIT_SOFTCAPPING, Keys.LLM.FINAL_LOGIT_SOFTCAPPING,
                         Keys.LLM.ROUTER_LOGIT_SOFTCAPPING, Keys.Rope.SCALING_YARN_BETA_FAST,
                         Keys.Rope.SCALING_YARN_EXT_FACTOR, Keys.Rope.SCALING_YARN_BETA_SLOW,
                         Keys.Rope.SCALING_YARN_ATTN_FACTOR})

    def __init__(self, gguf):
        super().__init__(gguf)
        self.embed_scale = float(self.key(Keys.LLM.EMBEDDING_SCALE, EMBEDDING_SCALE)) or None   # 0: not scaled
        self.logit_scale = float(self.key(Keys.LLM.LOGIT_SCALE, LOGIT_SCALE))
        self.final_cap = float(self.key(Keys.LLM.FINAL_LOGIT_SOFTCAPPING, 0.0))
        self.refuse_what_llama_cpp_cannot_load()

    def refuse_what_llama_cpp_cannot_load(self) -> None:
        """llama.cpp's grok graph asserts RoPE over whole heads as wide as the values; its loader takes
        Q and the output projection as wide as the stream, no rope_freqs, the dense MLP
        feed_forward_length wide and the experts expert_feed_forward_length (else feed_forward_length).
        YaRN's extension factor is computed where it mixes in YaRN's angles and scale (positive,
        under YaRN scaling) or changes nothing (none under any other)."""
        hp, path, rope = self.hp, self.gguf.path, self.trunk_rope
        value_dim = int(self.key(Keys.Attention.VALUE_LENGTH, hp.head_dim))
        if rope.dim != hp.head_dim or value_dim != hp.head_dim:
            raise UserError(f"{path}: grok rotates whole heads of one size (llama.cpp asserts it): RoPE over "
                            f"{rope.dim} of {hp.head_dim}, values of {value_dim}")
        if hp.n_head * hp.head_dim != hp.hidden:
            raise UserError(f"{path}: {hp.n_head} heads of {hp.head_dim} are not the embedding_length {hp.hidden} "
                            f"llama.cpp's grok loader sizes Q and the output projection by")
        if TENSOR_NAMES[MT.ROPE_FREQS] + ".weight" in self.gguf.tensors:
            raise UserError(f"{path}: tensor rope_freqs.weight is not part of the grok model llama.cpp loads")
        ext = self.yarn_ext_factor()
        if (rope.yarn is not None and not ext) or (rope.yarn is None and rope.scale != 1.0 and ext):
            raise UserError(f"{path}: yarn_ext_factor {ext:g} under {self.key(Keys.Rope.SCALING_TYPE, 'linear')} RoPE "
                            f"scaling is not computed by layercycle for grok")
        for i in range(hp.n_layers):
            n_ff = int(self.layer_key(Keys.LLM.FEED_FORWARD_LENGTH, i, 0))
            name = lambda kind: f"{TENSOR_NAMES[kind].format(bid=i)}.weight"  # noqa: E731
            for kind, shape in ((MT.FFN_UP, (n_ff, hp.hidden)), (MT.FFN_GATE, (n_ff, hp.hidden)),
                                (MT.FFN_DOWN, (hp.hidden, n_ff))):
                expect(self, name(kind), shape, "feed_forward_length x embedding_length, or its transpose")
            n_ff_exp = int(self.layer_key(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, i, 0)) or n_ff
            experts = self.gguf.tensors.get(name(MT.FFN_DOWN_EXP))
            if experts is not None and experts.shape[-1] != n_ff_exp:
                raise UserError(f"{path}: tensor {name(MT.FFN_DOWN_EXP)} is {list(experts.shape)} where the "
                                f"metadata gives experts {n_ff_exp} wide (expert_feed_forward_length, else "
                                f"feed_forward_length)")

    def yarn_ext_factor(self) -> float:
        """llama.cpp's yarn_ext_factor: the file's (negative: not set), else 1 under YaRN scaling, 0 otherwise."""
        ext = float(self.key(Keys.Rope.SCALING_YARN_EXT_FACTOR, -1.0))
        return ext if ext >= 0 else float(self.key(Keys.Rope.SCALING_TYPE, "linear") == "yarn")

    def attention_scale(self) -> float:
        return float(self.key(Keys.Attention.OUTPUT_SCALE, ATTENTION_SCALE))   # diff: the file's multiplier

    def yarn_betas(self) -> dict[str, float]:
        return {"ext_factor": self.yarn_ext_factor(),
                "beta_fast": float(self.key(Keys.Rope.SCALING_YARN_BETA_FAST, YARN_BETA_FAST)),
                "beta_slow": float(self.key(Keys.Rope.SCALING_YARN_BETA_SLOW, YARN_BETA_SLOW))}

    def ffn_kind(self, i: int) -> str:
        return "moe"   # llama.cpp's loader requires the router on every layer

    def layer(self, spec: LayerSpec, t: BlockTensors) -> PrePostNormLayer:
        post = MT.LAYER_OUT_NORM if t.has(MT.LAYER_OUT_NORM) else MT.FFN_POST_NORM   # Grok-1's name, else Grok-2's
        return PrePostNormLayer(spec, self.hp.eps, attn_norm=t(MT.ATTN_NORM), attention=self.mixer(spec, t),
                                attn_post_norm=t(MT.ATTN_OUT_NORM), ffn_norm=t(MT.FFN_NORM),
                                ffn=self.ffn(spec, t), ffn_post_norm=t(post))

    def attention(self, spec: AttentionSpec, t: BlockTensors) -> SoftCappedAttention:
        cap = float(self.key(Keys.LLM.ATTN_LOGIT_SOFTCAPPING, ATTENTION_CAP))
        return UnfusedSoftCappedAttention(self.attention_weights(spec, t), spec, self.hp.eps, cap)

    def moe(self, i: int, t: BlockTensors) -> ResidualMoE:
        dense = None
        if t.has(MT.FFN_UP):   # Grok-2: a dense MLP of feed_forward_length beside the experts
            dense = MLP(t(MT.FFN_UP), t(MT.FFN_DOWN), t(MT.FFN_GATE, required=False), self.activation)
        return ResidualMoE(router=t(MT.FFN_GATE_INP), experts=self.routed_experts(t), act=self.activation,
                           routing=self.routing(i), shared=dense)

    def finish_logits(self, logits: torch.Tensor) -> torch.Tensor:
        logits = logits * self.logit_scale
        return logits if not self.final_cap else torch.tanh(logits / self.final_cap) * self.final_cap
