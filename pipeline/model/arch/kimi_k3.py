"""kimi-k3 (Kimi-K3): kimi-linear's hybrid of Kimi Delta Attention (KDA) layers and, where
head_count_kv is not 0, deepseek2's latent attention (MLA) without RoPE, with these differences, as
llama.cpp's graph defines them (src/models/kimi-k3.cpp):

- attention residuals (attn_res.block_size > 0): the input of a layer's mixer and of its
  feed-forward block is a softmax-weighted sum of the residuals banked so far and the stream, each
  scored by RMSNorm(v) . score (attn_res_score, ffn_res_score; output_res_score before the final
  norm); a layer whose index is a multiple of the block size banks its input, and its stream
  restarts from its mixer's output. A boundary carries the banked residuals beside the stream
  (`boundary_width`): [B, T, (banked + 1) x hidden], the banked first, in order;
- KDA: kimi-linear's decay, A_h softplus(f_b(f_a x) + dt_bias) (A = -exp(A_log) as the converter
  writes it), or where kda.gate_lower_bound is set lower_bound * sigmoid(exp(A_log) (f_b(f_a x) +
  dt_bias)); the output gate full-rank, sigmoid(ssm_g x); Q, K and V from attn_q/k/v;
- MLA: each value of each head's output scaled by sigmoid(attn_gate x) where the file has attn_gate,
  x the layer's normed input; K_b and V_b apart (llama.cpp's graph takes no attn_kv_b);
- SiTU in place of SwiGLU in every feed-forward block: beta tanh(gate / beta) sigmoid(gate) times
  the up projection, itself linear_beta tanh(up / linear_beta) where linear_beta > 0;
- latent experts (expert_latent_length): routed on the full-width normed input, run on its
  projection ffn_routed_down, their weighted sum RMS-normed (ffn_routed_norm, where present) and
  projected back (ffn_routed_up); the shared experts on the full width, beside them. The top-k
  weights renormalised as expert_weights_norm says, scaled.
"""
import functools
import math

import torch
import torch.nn.functional as F
from gguf import MODEL_TENSOR as MT
from gguf import TENSOR_NAMES, Keys
from torch import nn

from ...errors import UserError
from .bailingmoe3 import KDA_GATE_LOWER_BOUND, HeadGatedLatentAttention, SafeGateDeltaAttention
from .blocks import rms_norm, wide
from .deepseek2 import Deepseek2
from .family import LayerSpec
from .ffn import MLP, MoE, Routed
from .kimi_linear import KimiDeltaAttention, KimiLinear
from .loading import BlockTensors, read_tensor
from .modules import Head, Layer
from .shapes import expect

# gguf-py's Keys.AttnRes.BLOCK_SIZE, Keys.Activation.SITU_BETA / SITU_LINEAR_BETA and
# Keys.LLM.EXPERT_LATENT_LENGTH (newer than the installed gguf)
ATTN_RES_BLOCK_SIZE = "{arch}.attn_res.block_size"
SITU_BETA = "{arch}.activation.situ_beta"
SITU_LINEAR_BETA = "{arch}.activation.situ_linear_beta"
EXPERT_LATENT_LENGTH = "{arch}.expert_latent_length"
OUTPUT_RES_SCORE = "output_res_score.weight"
REQUIRED_KEYS = (Keys.Attention.KEY_LENGTH_MLA, Keys.Attention.VALUE_LENGTH_MLA, Keys.Attention.KV_LORA_RANK,
                 Keys.SSM.CONV_KERNEL, Keys.KDA.HEAD_DIM, Keys.LLM.EXPERT_FEED_FORWARD_LENGTH,
                 Keys.LLM.EXPERT_SHARED_COUNT, ATTN_RES_BLOCK_SIZE, SITU_BETA, SITU_LINEAR_BETA)


def situ(gate: torch.Tensor, up: torch.Tensor, beta: float, linear_beta: float) -> torch.Tensor:
    """llama.cpp's SiTU: beta tanh(gate / beta) sigmoid(gate) times the up projection, itself
    linear_beta tanh(up / linear_beta) where linear_beta > 0."""
    if linear_beta > 0:
        up = torch.tanh(up * (1 / linear_beta)) * linear_beta
    return torch.tanh(gate * (1 / beta)) * beta * torch.sigmoid(gate) * up


def depth_mix(banked: torch.Tensor, h: torch.Tensor, score: torch.Tensor | None, eps: float) -> torch.Tensor:
    """The stream h [B, T, hidden] mixed with the banked residuals [B, T, n, hidden]: a softmax over
    each one's RMSNorm(v) . score, the stream's last, weighting the values themselves. Nothing banked
    (or no attention residuals): the stream."""
    if score is None or banked.shape[-2] == 0:
        return h
    values = wide(torch.cat([banked, h[..., None, :]], dim=-2))                   # [B, T, n + 1, hidden]
    p = (rms_norm(values, None, eps) * score).sum(-1).softmax(-1)                 # [B, T, n + 1]
    return (p[..., None] * values).sum(-2).to(h.dtype)


class KimiK3DeltaAttention(SafeGateDeltaAttention):
    """Kimi Delta Attention with Kimi-K3's full-rank output gate sigmoid(g x); the decay Kimi's
    (lower_bound None) or the safe gate over Kimi's low-rank forget projection."""

    forget = KimiDeltaAttention.forget

    def describe(self) -> str:
        return KimiDeltaAttention.describe(self) if self.lower_bound is None else super().describe()

    def decay(self, x: torch.Tensor) -> torch.Tensor:
        return KimiDeltaAttention.decay(self, x) if self.lower_bound is None else super().decay(x)


class LatentMoE(MoE):
    """Routed experts (no shared expert: the layer adds it) over the layer's input or its projection
    to the latent space, routed on the layer's full-width input `stream`."""

    def route(self, flat: torch.Tensor, stream: torch.Tensor) -> Routed:
        return super().route(stream.reshape(-1, stream.shape[-1]))


class KimiK3Layer(Layer):
    """llama.cpp's kimi-k3 graph, one layer: forward(x [B, T, (banked + 1) x hidden]) -> [B, T,
    (banked' + 1) x hidden], the banked residuals then the stream. `banks`: the layer starts a block
    (banks its input; its stream restarts from its mixer's output)."""

    def __init__(self, spec, eps: float, hidden: int, banks: bool, **parts):
        super().__init__(spec, eps, **parts)
        self.hidden, self.banks = hidden, banks

    def forward(self, x: torch.Tensor, tables, state: dict | None = None) -> torch.Tensor:
        B, T, _ = x.shape
        streams = x.view(B, T, -1, self.hidden)
        banked, h = streams[..., :-1, :], streams[..., -1, :]                     # [B, T, n, hidden], [B, T, hidden]
        mixed = depth_mix(banked, h, self.attn_res_score, self.eps)
        if self.banks:
            banked = torch.cat([banked, h[..., None, :]], dim=-2)
        a = self.mixer(self.norm(mixed, self.attn_norm), tables, state)
        h = a if self.banks else h + a
        h = h + self.feed_forward(self.norm(depth_mix(banked, h, self.ffn_res_score, self.eps), self.ffn_norm))
        return torch.cat([banked, h[..., None, :]], dim=-2).flatten(2)

    def feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The dense MLP, or the routed experts (in the latent space where the layer has one) beside
        the shared ones."""
        if self.moe is None:
            return self.mlp(x)
        routed = self.moe(x if self.routed_down is None else F.linear(x, self.routed_down), x)
        if self.routed_norm is not None:
            routed = self.norm(routed, self.routed_norm)
        if self.routed_up is not None:
            routed = F.linear(routed, self.routed_up)
        return routed if self.shared is None else routed + self.shared(x)


class KimiK3Head(Head):
    """The final norm and LM head over the stream mixed with the banked residuals by
    output_res_score (none: the stream as it is)."""

    def __init__(self, score: torch.Tensor | None, norm: torch.Tensor, weight: torch.Tensor, eps: float, hidden: int):
        super().__init__(norm, weight, eps, normalize=self.mixed_norm)
        self.register_buffer("score", score, persistent=False)
        self.hidden = hidden

    def mixed_norm(self, x: torch.Tensor, norm: torch.Tensor, eps: float) -> torch.Tensor:
        streams = x.unflatten(-1, (-1, self.hidden))                                # [..., banked + 1, hidden]
        return rms_norm(depth_mix(streams[..., :-1, :], streams[..., -1, :], self.score, eps), norm, eps)


class KimiK3(KimiLinear):
    numerics = 1
    own_head_required = True
    float32_tensors = KimiLinear.float32_tensors + ("_res_score.weight",)   # scores read as norm weights
    # llama.cpp reads expert_weights_norm for this architecture (kimi-linear forces it) and no yarn_log_mul
    honours = Deepseek2.honours - {Keys.Rope.SCALING_YARN_LOG_MUL}

    required_keys = REQUIRED_KEYS   # llama.cpp's loader stops without them (expert_gating_func: read_gating)

    def __init__(self, gguf):
        super().__init__(gguf)
        self.check_k3_tensors()

    # -- settings --------------------------------------------------------------------------
    def normalizes_expert_weights(self) -> bool:
        return self.weights_norm_in_file()

    @functools.cached_property
    def block_size(self) -> int:
        """Layers per block of the attention residuals; 0: none (a plain residual stream)."""
        return int(self.key(ATTN_RES_BLOCK_SIZE))

    def gate_lower_bound(self) -> float | None:
        """kda.gate_lower_bound (< 0), which turns the KDA decay into the safe gate; None: unset."""
        bound = self.gguf.arch_value(KDA_GATE_LOWER_BOUND)
        if bound is not None and not float(bound) < 0:
            raise UserError(f"{self.gguf.path}: {KDA_GATE_LOWER_BOUND.format(arch=self.gguf.architecture)} is "
                            f"{float(bound):g}; it must be negative")
        return None if bound is None else float(bound)

    def expert_width(self) -> int:
        return int(self.key(EXPERT_LATENT_LENGTH, 0)) or self.hp.hidden

    def gated_unit(self, i: int, shared: bool = False):
        return functools.partial(situ, beta=float(self.key(SITU_BETA)), linear_beta=float(self.key(SITU_LINEAR_BETA)))

    def banked(self, cut: int) -> int:
        """Residuals banked before layer `cut` (by the layers whose index is a multiple of the block size)."""
        return math.ceil(cut / self.block_size) if self.block_size else 0

    def boundary_width(self, cut: int) -> int:
        return (self.banked(cut) + 1) * self.hp.hidden

    def activation_floats(self, i: int) -> int:
        """KimiLinear's, with the banked residuals of the boundaries around layer i counted once, not
        twice: the layer reads them where the input boundary holds them and copies them once into the
        output (measured at hidden 2048, batch 2: peaks of 121 to 137 MiB, against 244 counted twice
        and 220 once)."""
        banked = self.boundary_width(i) + self.boundary_width(i + 1) - 2 * self.hp.hidden
        return super().activation_floats(i) - banked

    # -- layers ----------------------------------------------------------------------------
    def layer(self, spec: LayerSpec, t: BlockTensors) -> KimiK3Layer:
        i, res = spec.index, self.block_size > 0
        parts = dict(attn_norm=t(MT.ATTN_NORM), mixer=self.mixer(spec, t), ffn_norm=t(MT.FFN_NORM),
                     attn_res_score=t("attn_res_score", required=res), ffn_res_score=t("ffn_res_score", required=res))
        if spec.ffn == "mlp":
            parts |= dict(mlp=self.ffn(spec, t), moe=None)
        else:
            latent = self.expert_width() != self.hp.hidden   # else no projections (nor norm) around the experts
            shared = None
            if t.has(MT.FFN_UP_SHEXP):
                shared = MLP(t(MT.FFN_UP_SHEXP), t(MT.FFN_DOWN_SHEXP), t(MT.FFN_GATE_SHEXP), self.activation,
                             glu=self.gated_unit(i, shared=True))
            parts |= dict(moe=LatentMoE(router=t(MT.FFN_GATE_INP), experts=self.routed_experts(t), act=self.activation,
                                        routing=self.routing(i), selection_bias=t(MT.FFN_EXP_PROBS_B, "bias"),
                                        glu=self.gated_unit(i)),
                          shared=shared, routed_down=t("ffn_routed_down") if latent else None,
                          routed_norm=t("ffn_routed_norm", required=False) if latent else None,
                          routed_up=t("ffn_routed_up") if latent else None)
        return KimiK3Layer(spec, self.hp.eps, self.hp.hidden, res and i % self.block_size == 0, **parts)

    def mixer(self, spec: LayerSpec, t: BlockTensors) -> nn.Module:
        if spec.mixer == "kda":
            return self.kda(t)
        mla = Deepseek2.mixer(self, spec, t)
        gate = t(MT.ATTN_GATE, required=False)
        return mla if gate is None else HeadGatedLatentAttention(mla.w | {"gate": gate}, mla.spec, mla.eps, mla.kv_rank)

    def kda(self, t: BlockTensors) -> KimiK3DeltaAttention:
        n_head, d_k, width = self.kda_sizes()
        bound = self.gate_lower_bound()
        convs = [t(kind).reshape(-1, width) for kind in (MT.SSM_CONV1D_Q, MT.SSM_CONV1D_K, MT.SSM_CONV1D_V)]
        A = t(MT.SSM_A, None)   # -exp(A_log); the safe gate's sigmoid reads exp(A_log), exactly its negation
        w = {"q": t(MT.ATTN_Q), "k": t(MT.ATTN_K), "v": t(MT.ATTN_V), "conv": torch.cat(convs), "f_a": t(MT.SSM_F_A),
             "f_b": t(MT.SSM_F_B), "dt_bias": t(MT.SSM_DT, "bias"), "A": A if bound is None else A.neg_(),
             "beta": t(MT.SSM_BETA), "g": t("ssm_g"), "norm": t(MT.SSM_NORM), "out": t(MT.ATTN_OUT)}
        return KimiK3DeltaAttention(w, n_head, d_k, self.hp.eps, bound)

    # -- the head --------------------------------------------------------------------------
    def load_head(self, device, dtype) -> KimiK3Head:
        def held(name):
            return read_tensor(self.gguf, name, device, self.held_dtype(name, dtype))

        norm = TENSOR_NAMES[MT.OUTPUT_NORM] + ".weight"
        score = held(OUTPUT_RES_SCORE) if self.block_size else None
        return KimiK3Head(score, held(norm), held(TENSOR_NAMES[MT.OUTPUT] + ".weight"), self.hp.eps, self.hp.hidden)

    # -- shapes ----------------------------------------------------------------------------
    def kda_shapes(self, i: int) -> list[tuple[str, tuple[int, ...], str, bool]]:
        """kimi-linear's, the output gate full-rank (ssm_g in place of ssm_g_a and ssm_g_b)."""
        hidden, (n_head, d_k, _) = self.hp.hidden, self.kda_sizes()
        return [s for s in super().kda_shapes(i) if s[0] not in ("ssm_g_a", "ssm_g_b")] + [
            ("ssm_g", (n_head * d_k, hidden), "heads x kda.head_dim x embedding_length", True)]

    def check_k3_tensors(self) -> None:
        """What llama.cpp's loader requires beyond kimi-linear's: the residuals' scores where there
        are blocks (and none where there are not); on latent attention K_b and V_b apart (no
        attn_kv_b) and the gate's shape; the dense blocks' gate; the routed experts' gates, selection
        bias, latent projections and the shared experts' width, expert_feed_forward_length x
        expert_shared_count."""
        hidden, n_expert, latent = self.hp.hidden, int(self.key(Keys.LLM.EXPERT_COUNT, 0)), self.expert_width()
        expect(self, OUTPUT_RES_SCORE, (hidden,), "embedding_length", required=self.block_size > 0)
        if not self.block_size and OUTPUT_RES_SCORE in self.gguf.tensors:   # llama.cpp loads none: too many tensors
            raise UserError(f"{self.gguf.path}: tensor {OUTPUT_RES_SCORE} without attention residuals "
                            f"({ATTN_RES_BLOCK_SIZE.format(arch=self.gguf.architecture)} is 0)")
        for spec in self.specs:
            def name(kind, suffix=".weight", i=spec.index):
                return f"blk.{i}.{kind}{suffix}"
            for kind in ("attn_res_score", "ffn_res_score"):
                expect(self, name(kind), (hidden,), "embedding_length", required=self.block_size > 0)
            if spec.mixer == "latent_attention":
                if name("attn_kv_b") in self.gguf.tensors:
                    raise UserError(f"{self.gguf.path}: tensor {name('attn_kv_b')}: llama.cpp's kimi-k3 graph "
                                    f"takes attn_k_b and attn_v_b only")
                a = spec.attention
                expect(self, name("attn_gate"), (a.n_head * a.value_dim, hidden), "heads x value_length_mla x "
                       "embedding_length")
            if spec.ffn == "mlp":
                expect(self, name("ffn_gate"), self.gguf.tensors[name("ffn_up")].shape, "ffn_up's", required=True)
                continue
            ff = int(self.layer_key(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, spec.index))
            shared = ff * max(1, int(self.key(Keys.LLM.EXPERT_SHARED_COUNT)))
            checks = [("ffn_gate_exps", (n_expert, ff, latent), "expert_count x expert_feed_forward_length x "
                       "the experts' width", True),
                      ("exp_probs_b", (n_expert,), "expert_count", True),
                      ("ffn_up_shexp", (shared, hidden), "expert_feed_forward_length x expert_shared_count x "
                       "embedding_length", False)]
            if latent != hidden:
                checks += [("ffn_routed_down", (latent, hidden), "expert_latent_length x embedding_length", True),
                           ("ffn_routed_up", (hidden, latent), "embedding_length x expert_latent_length", True),
                           ("ffn_routed_norm", (latent,), "expert_latent_length", False)]
            for kind, shape, why, required in checks:
                expect(self, name(kind, ".bias" if kind == "exp_probs_b" else ".weight"), shape, why, required)
