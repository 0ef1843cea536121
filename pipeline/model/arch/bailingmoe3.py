"""bailingmoe3 (Ling 3.0; transformers' BailingHybrid): kimi-linear's hybrid of Kimi Delta Attention
(KDA) layers and, where head_count_kv is not 0, deepseek2's latent attention (MLA), with these
differences, as llama.cpp's graph defines them (src/models/bailingmoe3.cpp):

KDA: the forget gate is the "safe" one, full-rank, g = lower_bound * sigmoid(A_h (f_a x + dt_bias))
(A = exp(A_log) > 0 as the converter writes it, lower_bound = kda.gate_lower_bound < 0), in place of
Kimi's A_h softplus(f_b(f_a x) + dt_bias); the output gate is sigmoid(g_a x), one projection to
heads x head size, in place of Kimi's g_b(g_a x). MLA: the decoupled key part rotated (RoPE on
consecutive pairs, the file's base and scaling), the heads' outputs each multiplied by one
sigmoid(attn_gate x) (x the layer's normed input) before the output projection; Q.K scaled by
1 / sqrt(key_length_mla) alone. Experts as bailingmoe2's (sigmoid with a selection bias, the file's
groups, weight norm and scale, beside a shared expert), with Step-3.5's SwiGLU limits per layer
(swiglu_clamp_exp on the routed experts; swiglu_clamp_shexp on the shared expert and, as
llama.cpp's build_ffn reads it for any gated SiLU block, on the dense lead blocks too). The
multi-token-prediction block after the trunk (nextn_predict_layers) is never run.
"""
import functools

import torch
import torch.nn.functional as F
from gguf import MODEL_TENSOR as MT
from gguf import Keys
from torch import nn

from ...errors import UserError
from .blocks import wide
from .deepseek2 import Deepseek2, LatentAttention
from .family import DecoderArch, LayerSpec
from .ffn import swiglu_limited
from .kimi_linear import KimiDeltaAttention, KimiLinear
from .loading import BlockTensors
from .shapes import expect

KDA_SAFE_GATE = "{arch}.kda.safe_gate"                 # gguf-py's Keys.KDA.SAFE_GATE (newer than the installed gguf)
KDA_GATE_LOWER_BOUND = "{arch}.kda.gate_lower_bound"   # ... Keys.KDA.GATE_LOWER_BOUND
LIMIT_EPS = 1e-6   # llama.cpp's: a SwiGLU limit at or below it means none
REQUIRED_KEYS = (Keys.Attention.KEY_LENGTH_MLA, Keys.Attention.VALUE_LENGTH_MLA, Keys.Attention.KV_LORA_RANK,
                 Keys.SSM.CONV_KERNEL, Keys.KDA.HEAD_DIM, KDA_GATE_LOWER_BOUND, Keys.LLM.EXPERT_FEED_FORWARD_LENGTH,
                 Keys.LLM.EXPERT_SHARED_COUNT, Keys.LLM.LEADING_DENSE_BLOCK_COUNT)


class SafeGateDeltaAttention(KimiDeltaAttention):
    """Kimi Delta Attention with Ling 3's full-rank gates: decay lower_bound * sigmoid(A (f x + dt_bias))
    per key channel, output gate sigmoid(g x)."""

    def __init__(self, w: dict, n_head: int, d_k: int, eps: float, lower_bound: float):
        super().__init__(w, n_head, d_k, eps)
        self.lower_bound = lower_bound

    def describe(self) -> str:
        return f"{super().describe()}, gate lower bound={self.lower_bound:g}"

    def decay(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, hidden] -> the log decay [B, T, h, d_k] of each key channel, in (lower_bound, 0)."""
        B, T, _ = x.shape
        w, h, dk = self.w, self.n_head, self.d_k
        f = (wide(self.forget(x)) + wide(w["dt_bias"])).view(B, T, h, dk)
        return torch.sigmoid(f * wide(w["A"]).view(h, 1)) * self.lower_bound

    def forget(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.w["f"])

    def output_gate(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, hidden] -> the pre-sigmoid output gate [B, T, h x d_k]."""
        return F.linear(x, self.w["g"])


class HeadGatedLatentAttention(LatentAttention):
    """Latent attention whose heads' outputs are scaled by sigmoid(gate x) before the output
    projection: each head by one value (`gate` [heads, hidden]) or each of its values (Kimi-K3's,
    [heads x value_dim, hidden])."""

    def forward(self, x: torch.Tensor, tables, state=None) -> torch.Tensor:
        q, k, v, _ = self.project(x, tables)
        y = self.values(self.attend(q, k, v, tables))                            # [B, H, T, value_dim]
        B, H, T, _ = y.shape
        gate = torch.sigmoid(wide(F.linear(x, self.w["gate"]))).to(y.dtype)    # [B, T, H (x value_dim)]
        return self.output(y * gate.view(B, T, H, -1).transpose(1, 2))


class BailingMoe3(KimiLinear):
    numerics = 1
    # llama.cpp reads expert_weights_norm for this architecture (kimi-linear forces it), rotates the
    # MLA keys with the generic RoPE and does not read yarn_log_mul; it reads the SwiGLU limits
    honours = (Deepseek2.honours - {Keys.Rope.SCALING_YARN_LOG_MUL}) | {
        Keys.LLM.SWIGLU_CLAMP_EXP, Keys.LLM.SWIGLU_CLAMP_SHEXP}

    required_keys = REQUIRED_KEYS   # llama.cpp's loader stops without them (expert_gating_func: read_gating)

    def __init__(self, gguf):
        super().__init__(gguf)
        self.check_ling_tensors()

    # -- settings --------------------------------------------------------------------------
    def normalizes_expert_weights(self) -> bool:
        return self.weights_norm_in_file()   # llama.cpp passes the file's expert_weights_norm (unset: no)

    def yarn_mscales(self) -> tuple[float, float]:
        return DecoderArch.yarn_mscales(self)   # kq_scale is 1 / sqrt(key_length_mla): no mscale folded in

    def gate_lower_bound(self) -> float:
        """kda.gate_lower_bound, which llama.cpp requires (< 0); kda.safe_gate, unset meaning true,
        must not be false (llama.cpp's graph has no other gate)."""
        path, arch = self.gguf.path, self.gguf.architecture
        if not bool(self.key(KDA_SAFE_GATE, True)):
            raise UserError(f"{path}: {KDA_SAFE_GATE.format(arch=arch)} is false; llama.cpp computes bailingmoe3's "
                            f"KDA with the safe gate only, and so does layercycle")
        bound = float(self.key(KDA_GATE_LOWER_BOUND))
        if not bound < 0:
            raise UserError(f"{path}: {KDA_GATE_LOWER_BOUND.format(arch=arch)} is {bound:g}; it must be negative")
        return bound

    def gated_unit(self, i: int, shared: bool = False):
        limit = float(self.layer_key(Keys.LLM.SWIGLU_CLAMP_SHEXP if shared else Keys.LLM.SWIGLU_CLAMP_EXP, i, 0.0))
        return functools.partial(swiglu_limited, limit=limit) if limit > LIMIT_EPS else None

    # -- layers ----------------------------------------------------------------------------
    def layer_spec(self, i: int) -> LayerSpec:
        if int(self.layer_key(Keys.Attention.HEAD_COUNT_KV, i)) == 0:
            return LayerSpec(i, "kda", self.ffn_kind(i))
        return LayerSpec(i, "latent_attention", self.ffn_kind(i), self.attention_spec(i))   # RoPE kept

    def mixer(self, spec: LayerSpec, t: BlockTensors) -> nn.Module:
        if spec.mixer == "kda":
            return self.kda(t)
        mla = Deepseek2.mixer(self, spec, t)
        return HeadGatedLatentAttention(mla.w | {"gate": t(MT.ATTN_GATE)}, mla.spec, mla.eps, mla.kv_rank)

    def kda(self, t: BlockTensors) -> SafeGateDeltaAttention:
        n_head, d_k, width = self.kda_sizes()
        convs = [t(kind).reshape(-1, width) for kind in (MT.SSM_CONV1D_Q, MT.SSM_CONV1D_K, MT.SSM_CONV1D_V)]
        w = {"q": t(MT.ATTN_Q), "k": t(MT.ATTN_K), "v": t(MT.ATTN_V), "conv": torch.cat(convs),
             "f": t(MT.SSM_F_A), "dt_bias": t(MT.SSM_DT, "bias"), "A": t(MT.SSM_A, None), "beta": t(MT.SSM_BETA),
             "g": t(MT.SSM_G_A), "norm": t(MT.SSM_NORM), "out": t(MT.ATTN_OUT)}
        return SafeGateDeltaAttention(w, n_head, d_k, self.hp.eps, self.gate_lower_bound())

    # -- shapes ----------------------------------------------------------------------------
    def check_kda_shapes(self) -> None:
        self.gate_lower_bound()
        super().check_kda_shapes()

    def kda_shapes(self, i: int) -> list[tuple[str, tuple[int, ...], str, bool]]:
        """Q, K and V apart: llama.cpp's graph multiplies by attn_q/k/v and has no fused attn_qkv (nor
        biases); the forget and output gates full-rank."""
        hidden, (n_head, d_k, _) = self.hp.hidden, self.kda_sizes()
        inner = n_head * d_k
        exact = [(kind, (inner, hidden), "heads x kda.head_dim x embedding_length", True)
                 for kind in ("attn_q", "attn_k", "attn_v", "ssm_f_a", "ssm_g_a")]
        return exact + [("ssm_beta", (n_head, hidden), "heads x embedding_length", True),
                        ("ssm_norm", (d_k,), "kda.head_dim", True),
                        ("attn_output", (hidden, inner), "embedding_length x heads x kda.head_dim", True)]

    def check_ling_tensors(self) -> None:
        """What llama.cpp's loader requires beyond deepseek2's latent attention and the generic
        blocks: K_b and V_b apart (no attn_kv_b), the head gate; the dense blocks' gate; the
        routed experts' gates, selection bias and the shared expert."""
        hidden, n_expert = self.hp.hidden, int(self.key(Keys.LLM.EXPERT_COUNT, 0))
        shared = self.gguf.arch_value(Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH)
        for spec in self.specs:
            def name(kind, suffix=".weight", i=spec.index):
                return f"blk.{i}.{kind}{suffix}"
            if spec.mixer == "latent_attention":
                if name("attn_kv_b") in self.gguf.tensors:
                    raise UserError(f"{self.gguf.path}: tensor {name('attn_kv_b')}: llama.cpp's bailingmoe3 loader "
                                    f"takes attn_k_b and attn_v_b only")
                expect(self, name("attn_gate"), (spec.attention.n_head, hidden), "heads x embedding_length",
                       required=True)
            if spec.ffn == "mlp":
                if name("ffn_gate") not in self.gguf.tensors:
                    raise UserError(f"{self.gguf.path}: missing tensor {name('ffn_gate')}")
            else:
                missing = [n for n in map(name, ("ffn_gate_exps", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"))
                           if n not in self.gguf.tensors]
                if missing:
                    raise UserError(f"{self.gguf.path}: missing tensor {missing[0]}")
                expect(self, name("exp_probs_b", ".bias"), (n_expert,), "expert_count", required=True)
                if shared is None:   # llama.cpp's default: the experts' width x expert_shared_count
                    ff = self.gguf.tensors[name("ffn_down_exps")].shape[2]
                    count = max(1, int(self.key(Keys.LLM.EXPERT_SHARED_COUNT)))
                    expect(self, name("ffn_up_shexp"), (ff * count, hidden),
                           "expert_feed_forward_length x expert_shared_count x embedding_length", required=True)
