"""kimi-linear (Kimi-Linear-48B-A3B): Kimi Delta Attention (KDA) layers and, where head_count_kv
is not 0, deepseek2's latent attention with its decoupled key part left unrotated (the model has
no RoPE); deepseek2's dense lead blocks and experts (routed as the file's expert_gating_func
says, the top-k weights always renormalised and scaled, beside a shared expert).

KDA, as llama.cpp's graph defines it: Q, K and V each from its own projection and short causal
convolution + SiLU; Q and K L2-normed per head; a forget gate per key channel,
g = A_h softplus(f_b(f_a x) + dt_bias) (A = -exp(A_log), as the converter writes it), and
beta = sigmoid(b x); the gated delta rule with g scaling the state's rows, over blocks of 16
(llama.cpp's, where exp of a channel's decay over a longer block would overflow); then
RMSNorm(o) per head times sigmoid(g_b(g_a x)), and the output projection. The decay and the
output gate are the mixer's `decay` and `output_gate` (bailingmoe3 computes both otherwise).
"""
import math
from dataclasses import replace

import torch
import torch.nn.functional as F
from gguf import MODEL_TENSOR as MT
from gguf import Keys
from torch import nn

from .blocks import rms_norm, wide
from .deepseek2 import Deepseek2
from .delta_net import delta_rule_blockwise, l2_norm
from .family import FLOAT32_TENSORS, LayerSpec
from .loading import BlockTensors
from .recurrent import RecurrentMixer
from .shapes import expect
from .ssm import SSM_FLOAT32_TENSORS, causal_conv1d

KDA_BLOCK = 16


class KimiDeltaAttention(RecurrentMixer):
    """x [B, T, hidden] -> [B, T, hidden]; `state` as GatedDeltaNet's."""

    def __init__(self, w: dict[str, torch.Tensor | None], n_head: int, d_k: int, eps: float):
        super().__init__(w)
        self.n_head, self.d_k, self.eps = n_head, d_k, eps
        self.projections = ("qkv",) if "qkv" in w else ("q", "k", "v")

    def describe(self) -> str:
        return f"heads={self.n_head}, d_k={self.d_k}, conv={self.w['conv'].shape[-1]}"

    def scan(self, x: torch.Tensor, tables=None, state: dict | None = None) -> torch.Tensor:
        w, (B, T, _), h, dk = self.w, x.shape, self.n_head, self.d_k
        qkv = torch.cat([F.linear(x, w[name]) for name in self.projections], dim=-1)       # [B, T, 3 h dk]
        qkv, conv_state = causal_conv1d(qkv, w["conv"], None, (state or {}).get("conv"))
        q, k, v = (t.reshape(B, T, h, dk) for t in wide(F.silu(qkv)).split(h * dk, dim=-1))
        q, k = l2_norm(q, self.eps), l2_norm(k, self.eps)
        g = self.decay(x)                                                                  # per key channel, <= 0
        beta = torch.sigmoid(wide(F.linear(x, w["beta"])))                                 # [B, T, h]
        o, ssm_state = delta_rule_blockwise(q * dk ** -0.5, k, v, g, beta, (state or {}).get("ssm"), KDA_BLOCK)
        gate = self.output_gate(x).view(B, T, h, dk)
        o = rms_norm(o, wide(w["norm"]), self.eps) * torch.sigmoid(wide(gate))             # [B, T, h, dk]
        if state is not None:
            state["conv"], state["ssm"] = conv_state, ssm_state
        return F.linear(o.reshape(B, T, h * dk).to(x.dtype), w["out"])

    def decay(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, hidden] -> the log decay [B, T, h, d_k] of each key channel: Kimi's
        A_h softplus(f_b(f_a x) + dt_bias)."""
        w, (B, T, _), h, dk = self.w, x.shape, self.n_head, self.d_k
        forget = wide(self.forget(x)) + wide(w["dt_bias"])                                  # [B, T, h dk]
        return F.softplus(forget).view(B, T, h, dk) * wide(w["A"]).view(h, 1)

    def forget(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, hidden] -> the forget projection [B, T, h x d_k] before its bias: f_b(f_a x)."""
        return F.linear(F.linear(x, self.w["f_a"]), self.w["f_b"])

    def output_gate(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, hidden] -> the output gate before its sigmoid [B, T, h x d_k]: g_b(g_a x)."""
        return F.linear(F.linear(x, self.w["g_a"]), self.w["g_b"])


class KimiLinear(Deepseek2):
    numerics = 2   # 2: its latent-attention layers through SDPA's fused kernel (blocks.sdpa)
    float32_tensors = FLOAT32_TENSORS + SSM_FLOAT32_TENSORS   # A and dt bias as Mamba2's
    # llama.cpp renormalises the top-k weights whatever expert_weights_norm says (a file that says
    # otherwise is refused) and scales attention by 1 / sqrt(head size) alone
    honours = Deepseek2.honours - {Keys.LLM.EXPERT_WEIGHTS_NORM, Keys.Rope.SCALING_YARN_LOG_MUL}

    def __init__(self, gguf):
        super().__init__(gguf)
        self.check_kda_shapes()

    def attention_scale(self) -> float:
        return 1 / math.sqrt(self.hp.head_dim)   # llama.cpp's kq_scale_mla: no RoPE, no YaRN factor

    def read_gating(self) -> str:
        return self.gating_in_file(None)   # llama.cpp stops on a file without expert_gating_func

    def normalizes_expert_weights(self) -> bool:
        return True

    def layer_spec(self, i: int) -> LayerSpec:
        if int(self.layer_key(Keys.Attention.HEAD_COUNT_KV, i)) == 0:
            return LayerSpec(i, "kda", self.ffn_kind(i))
        return LayerSpec(i, "latent_attention", self.ffn_kind(i), replace(self.attention_spec(i), rope=None))

    def mixer(self, spec: LayerSpec, t: BlockTensors) -> nn.Module:
        return self.kda(t) if spec.mixer == "kda" else super().mixer(spec, t)

    def activation_floats(self, i: int) -> int:
        """Deepseek2's, and on a KDA layer more of its chunked scan: 21 x its heads' width in all
        (measured at hidden 2048: 0.66 of the peak at the 9 x every recurrent mixer has, 1.0 at 18 x)."""
        n_head, d_k, _ = self.kda_sizes()
        return super().activation_floats(i) + (12 * n_head * d_k if self.specs[i].mixer == "kda" else 0)

    def kda_sizes(self) -> tuple[int, int, int]:
        """(heads, head size, convolution width) of the KDA layers."""
        return (int(self.hp.n_head), int(self.key(Keys.KDA.HEAD_DIM)), int(self.key(Keys.SSM.CONV_KERNEL)))

    def kda(self, t: BlockTensors) -> KimiDeltaAttention:
        n_head, d_k, width = self.kda_sizes()
        convs = [t(kind).reshape(-1, width) for kind in (MT.SSM_CONV1D_Q, MT.SSM_CONV1D_K, MT.SSM_CONV1D_V)]
        w = {"conv": torch.cat(convs), "f_a": t(MT.SSM_F_A), "f_b": t(MT.SSM_F_B), "dt_bias": t(MT.SSM_DT, "bias"),
             "A": t(MT.SSM_A, None), "beta": t(MT.SSM_BETA), "g_a": t(MT.SSM_G_A), "g_b": t(MT.SSM_G_B),
             "norm": t(MT.SSM_NORM), "out": t(MT.ATTN_OUT)}
        if t.has(MT.ATTN_QKV):
            w["qkv"] = t(MT.ATTN_QKV)
        else:
            w |= {"q": t(MT.ATTN_Q), "k": t(MT.ATTN_K), "v": t(MT.ATTN_V)}
        return KimiDeltaAttention(w, n_head, d_k, self.hp.eps)

    def kda_shapes(self, i: int) -> list[tuple[str, tuple[int, ...], str, bool]]:
        """(kind, shape, why, required) of layer i's KDA tensors but its convolutions, A and dt bias."""
        hidden, (n_head, d_k, _) = self.hp.hidden, self.kda_sizes()
        inner = n_head * d_k
        fused = f"blk.{i}.attn_qkv.weight" in self.gguf.tensors
        exact = [("attn_qkv", (3 * inner, hidden), "3 x heads x kda.head_dim x embedding_length", False),
                 ("ssm_f_a", (d_k, hidden), "kda.head_dim x embedding_length", True),
                 ("ssm_f_b", (inner, d_k), "heads x kda.head_dim x kda.head_dim", True),
                 ("ssm_g_a", (d_k, hidden), "kda.head_dim x embedding_length", True),
                 ("ssm_g_b", (inner, d_k), "heads x kda.head_dim x kda.head_dim", True),
                 ("ssm_beta", (n_head, hidden), "heads x embedding_length", True),
                 ("ssm_norm", (d_k,), "kda.head_dim", True),
                 ("attn_output", (hidden, inner), "embedding_length x heads x kda.head_dim", True)]
        return exact + [(kind, (inner, hidden), "heads x kda.head_dim x embedding_length", not fused)
                        for kind in ("attn_q", "attn_k", "attn_v")]

    def check_kda_shapes(self) -> None:
        """Every KDA tensor against the heads, head size and convolution width of the metadata
        (the convolutions and A in any of the shapes llama.cpp takes: theirs with unit axes)."""
        n_head, d_k, width = self.kda_sizes()
        inner = n_head * d_k
        for spec in (s for s in self.specs if s.mixer == "kda"):
            def name(kind, suffix=".weight", i=spec.index):
                return f"blk.{i}.{kind}{suffix}"
            for kind, shape, why, required in self.kda_shapes(spec.index):
                expect(self, name(kind), shape, why, required)
            expect(self, name("ssm_dt", ".bias"), (inner,), "heads x kda.head_dim", required=True)
            squeezed = [(name(kind), (inner, width), "heads x kda.head_dim x ssm.conv_kernel")
                        for kind in ("ssm_conv1d_q", "ssm_conv1d_k", "ssm_conv1d_v")]
            for tensor, shape, why in [*squeezed, (name("ssm_a", ""), (n_head,), "heads")]:
                expect(self, tensor, shape, why, required=True, unit_axes=True)
