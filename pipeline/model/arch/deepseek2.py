"""deepseek2 (DeepSeek-V2/V3/R1, Kimi K2): multi-head latent attention (MLA) over SwiGLU blocks
whose first `leading_dense_block_count` are dense and the rest mixtures of experts with shared
experts, routed by softmax or by sigmoid with a selection bias, a weight scale and expert groups.

MLA, as llama.cpp's graph defines it: Q from `attn_q` (a "lite" file) or `attn_q_b(norm(attn_q_a
x))`; `attn_kv_a_mqa x` splits into a compressed KV [kv_lora_rank], RMS-normed, and one decoupled
RoPE key [rope dim] shared by every head. Each head's key is its `attn_k_b` decompression of the
compressed KV followed by the shared RoPE key, its value the `attn_v_b` decompression; both are
joined at load into one [heads x (nope + value), rank] matrix, the `attn_kv_b` that older files
hold, so that the decompression is one matrix product. Queries and keys are (nope dim + rope
dim) wide, values `value_length_mla`. The product is the same as llama.cpp's absorbed form (K_b
folded into Q, V_b applied after attention); it is computed decompressed, which costs less for a
whole sequence. In llama-cpp numerics a file of split `attn_k_b` and `attn_v_b` is computed
absorbed, as llama.cpp computes it: its products' inputs (each head's query, each head's output
over the latent) and its cache (the normed latent beside the RoPE key) are rounded where
llama.cpp's are.
RoPE pairs consecutive values. With YaRN the attention scale is mscale^2 / sqrt(head size),
mscale = 1 + 0.1 * mscale_all_dim * ln(factor) (`rope.scaling.yarn_log_mul` holds 0.1 x that).
"""
import math
from dataclasses import replace

import torch
import torch.nn.functional as F
from gguf import MODEL_TENSOR as MT
from gguf import TENSOR_NAMES, Keys
from torch import nn

from ...errors import UserError
from ...numerics import emulating
from ..llama_cpp_numerics import kv_cached
from .blocks import Attention, AttentionSpec, rms_norm
from .family import DecoderArch, HParams, LayerSpec
from .loading import BlockTensors
from .rope import RopeSpec, apply_rope
from .shapes import expect

GLM47_LITE_VOCAB, GLM47_LITE_LAYERS = 154880, (47, 48)   # llama.cpp's sigmoid default for GLM-4.7 Lite


class LatentAttention(Attention):
    """Multi-head latent attention: x [B, T, hidden] -> [B, T, hidden]."""

    def __init__(self, w: dict[str, torch.Tensor | None], spec: AttentionSpec, eps: float, kv_rank: int):
        super().__init__(w, spec, eps)
        self.kv_rank = kv_rank

    def describe(self) -> str:
        return f"kv_lora_rank={self.kv_rank}, " + super().describe()

    def forward(self, x: torch.Tensor, tables, state=None) -> torch.Tensor:
        q, k, v, q_a = self.project(x, tables)
        return self.output(self.values(self.attend(q, k, v, tables)))

    def project(self, x: torch.Tensor, tables):
        """x [B, T, hidden] -> q, k [B, H, T, nope + rope], v [B, H, T, value_dim] and the normed
        query latent [B, T, q rank] (None in a "lite" file); absorbed (`k_b` held), q and k [B, H,
        T, rank + rope] and v [B, H, T, rank], the keys and values one latent for every head (a view)."""
        B, T, _ = x.shape
        w, s = self.w, self.spec
        rope: RopeSpec | None = s.rope
        q_a = rms_norm(F.linear(x, w["q_a"]), w["q_a_norm"], self.eps) if "q_a" in w else None
        q = F.linear(x, w["q"]) if q_a is None else F.linear(q_a, w["q_b"])
        q = q.view(B, T, s.n_head, s.key_dim).transpose(1, 2)                      # [B, H, T, nope + rope]
        rope_dim = w["kv_a"].shape[0] - self.kv_rank                                # the decoupled key's width
        kv, k_pe = F.linear(x, w["kv_a"]).split([self.kv_rank, rope_dim], dim=-1)  # [B, T, rank], [B, T, rope]
        kv = rms_norm(kv, w["kv_a_norm"], self.eps)                                 # [B, T, rank]
        q_nope, q_pe = q.split([s.key_dim - rope_dim, rope_dim], dim=-1)
        if "k_b" in w:   # absorbed: each head's query taken into the latent, which is every head's key and value
            q_nope, k_nope, v = per_head(q_nope, w["k_b"]), kv[:, None], kv[:, None]   # [B, H | 1, T, rank]
        else:
            k_nope, v = F.linear(kv, w["kv_b"]).view(B, T, s.n_head, -1).transpose(1, 2).split(
                [s.key_dim - rope_dim, s.value_dim], dim=-1)                         # [B, H, T, nope], [.., value]
        if "k_pe_norm" in w:   # dots3note: the shared RoPE key RMS-normed before RoPE
            k_pe = rms_norm(k_pe, w["k_pe_norm"], self.eps)
        k_pe = k_pe[:, None]                                                        # [B, 1, T, rope]
        if rope is not None:   # (Kimi Linear rotates nothing)
            cos, sin = tables.rope(rope)
            q_pe, k_pe = apply_rope(q_pe, cos, sin, rope), apply_rope(k_pe, cos, sin, rope)
        heads = k_nope.shape[1]
        k = kv_cached(torch.cat([k_nope, k_pe.expand(B, heads, T, rope_dim)], dim=-1))  # as the cache holds them
        v = kv_cached(v)
        return torch.cat([q_nope, q_pe], dim=-1), k.expand(B, s.n_head, T, -1), v.expand(B, s.n_head, T, -1), q_a

    def values(self, y: torch.Tensor) -> torch.Tensor:
        """The heads' outputs of attention as values [B, H, T, value_dim]: absorbed, y [B, H, T,
        rank] over the latent, each head's `v_b` of it; otherwise y itself."""
        return per_head(y, self.w["v_b"]) if "v_b" in self.w else y

    def output(self, y: torch.Tensor) -> torch.Tensor:
        """The heads' outputs y [B, H, T, value_dim] -> [B, T, hidden]."""
        B, H, T, D = y.shape
        return F.linear(y.transpose(1, 2).reshape(B, T, H * D), self.w["o"])


def per_head(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Each head's own product: x [B, H, T, K], w [H, N, K] -> [B, H, T, N]."""
    return torch.stack([F.linear(x[:, h], w[h]) for h in range(w.shape[0])], dim=1)


def absorbed(gguf, i: int) -> bool:
    """Layer i's latent attention computed absorbed: in llama-cpp numerics, over a file of split
    `attn_k_b` and `attn_v_b` (no `attn_kv_b`), as llama.cpp computes such a file."""
    return emulating() and TENSOR_NAMES[MT.ATTN_KV_B].format(bid=i) + ".weight" not in gguf.tensors


def decompression(t: BlockTensors) -> dict[str, torch.Tensor]:
    """A latent-attention layer's decompression: the file's `attn_kv_b`, or its per-head `attn_k_b`
    [H, rank, nope] and `attn_v_b` [H, value, rank] joined into one (K_b transposed, then V_b:
    [H x (nope + value), rank]); absorbed, these two as they are."""
    if absorbed(t.gguf, t.i):
        return {"k_b": t(MT.ATTN_K_B), "v_b": t(MT.ATTN_V_B)}
    if t.has(MT.ATTN_KV_B):
        return {"kv_b": t(MT.ATTN_KV_B)}
    k_b, v_b = t.unheld(MT.ATTN_K_B), t.unheld(MT.ATTN_V_B)
    return {"kv_b": t.keep(torch.cat([k_b.transpose(1, 2), v_b], dim=1).flatten(0, 1))}


class Deepseek2(DecoderArch):
    fused_gate_up_experts = True   # Mistral 4's converter writes ffn_gate_up_exps; llama.cpp loads either
    numerics = 3                   # 2: YaRN's mscale read as 1 for mistral4 files, as llama.cpp reads it; 3: SDPA's
    #                                fused kernel over the values padded to the keys' size (blocks.sdpa)
    honours = frozenset({Keys.Attention.Q_LORA_RANK, Keys.Attention.KV_LORA_RANK, Keys.LLM.EXPERT_WEIGHTS_NORM,
                         Keys.LLM.EXPERT_WEIGHTS_SCALE, Keys.LLM.EXPERT_GATING_FUNC, Keys.LLM.LEADING_DENSE_BLOCK_COUNT,
                         Keys.Rope.SCALING_YARN_LOG_MUL})

    def __init__(self, gguf):
        super().__init__(gguf)
        self.check_latent_shapes()

    def ffn_kind(self, i: int) -> str:
        return self.dense_then_experts(i)

    def normalizes_expert_weights(self) -> bool:
        return self.weights_norm_in_file()

    def read_gating(self) -> str:
        """Older DeepSeek-V2 files set no gating function: softmax, as llama.cpp reads them (its
        GLM-4.7 Lite sizes aside)."""
        layers = int(self.key(Keys.LLM.BLOCK_COUNT)) - int(self.key(Keys.LLM.NEXTN_PREDICT_LAYERS, 0))
        lite_glm = layers in GLM47_LITE_LAYERS and self.key(Keys.LLM.VOCAB_SIZE, 0) == GLM47_LITE_VOCAB
        return self.gating_in_file("sigmoid" if lite_glm else "softmax")

    @property
    def latent(self) -> bool:
        """MLA files state the decompressed head sizes (key_length_mla / value_length_mla)."""
        return self.gguf.arch_value(Keys.Attention.KEY_LENGTH_MLA) is not None

    def read_hparams(self) -> HParams:
        hp = super().read_hparams()
        if not self.latent:   # a file of the older layout: key_length is the decompressed head
            return hp
        return replace(hp, head_dim=int(self.key(Keys.Attention.KEY_LENGTH_MLA)))

    def value_dim(self) -> int:
        return int(self.key(Keys.Attention.VALUE_LENGTH_MLA if self.latent else Keys.Attention.VALUE_LENGTH))

    def kv_rank(self) -> int:
        return int(self.key(Keys.Attention.KV_LORA_RANK))

    def layer_kv_rank(self, i: int) -> int:
        """Layer i's kv_lora_rank (a family with layers of two geometries overrides it)."""
        return self.kv_rank()

    def layer_spec(self, i: int) -> LayerSpec:
        return LayerSpec(i, "latent_attention", self.ffn_kind(i), self.attention_spec(i))

    def activation_floats(self, i: int) -> int:
        """DecoderArch's, and on a latent-attention layer its keys and values decompressed per head,
        the values padded to the keys' size (blocks.sdpa): two key heads a head (measured at hidden
        2048: 0.89 of the peak without them). Computed absorbed (llama-cpp numerics over split
        `attn_k_b` and `attn_v_b`), three heads of rank + rope dim a head instead: the queries, the
        keys and the values padded to them, each over the latent."""
        a = self.specs[i].attention
        if self.specs[i].mixer != "latent_attention":
            return super().activation_floats(i)
        if absorbed(self.gguf, i):
            return super().activation_floats(i) + 3 * a.n_head * (self.layer_kv_rank(i) + self.trunk_rope.dim)
        return super().activation_floats(i) + 2 * a.n_head * a.key_dim

    def attention_spec(self, i: int) -> AttentionSpec:
        n_head = int(self.layer_key(Keys.Attention.HEAD_COUNT, i))
        return AttentionSpec(n_head=n_head, n_kv=n_head, key_dim=self.hp.head_dim, value_dim=self.value_dim(),
                             scale=self.attention_scale(), rope=self.trunk_rope)

    def yarn_mscales(self) -> tuple[float, float]:
        """The file holds 0.1 x mscale_all_dim. llama.cpp takes DeepSeek's mscale to be equal to it
        for deepseek2 files, so that cos and sin are unscaled and the whole YaRN factor goes into the
        attention scale; for every other architecture of this graph (mistral4, deepseek32, glm-dsa)
        it takes mscale to be 1 (llama-context.cpp)."""
        log_mul = float(self.key(Keys.Rope.SCALING_YARN_LOG_MUL, 0.0)) / 0.1
        return (log_mul if self.gguf.architecture == "deepseek2" else 1.0), log_mul

    def attention_scale(self) -> float:
        """llama.cpp's kq_scale: mscale^2 / sqrt(head size), mscale the RoPE's own factor (that of
        cos and sin, ggml's 1 + 0.1 ln(scale) included) times 1 + 0.1 mscale_all_dim ln(scale)."""
        rope, mscale_all_dims = self.trunk_rope, self.yarn_mscales()[1]
        ln_scale = math.log(rope.scale)
        rope_factor = (rope.yarn.attn_factor if rope.yarn is not None else rope.mscale) * (1 + 0.1 * ln_scale)
        mscale = rope_factor * (1 + 0.1 * mscale_all_dims * ln_scale)
        return mscale * mscale / math.sqrt(self.hp.head_dim)

    def mixer(self, spec: LayerSpec, t: BlockTensors) -> nn.Module:
        w = {"kv_a": t(MT.ATTN_KV_A_MQA), "kv_a_norm": t(MT.ATTN_KV_A_NORM), "o": t(MT.ATTN_OUT)}
        if t.has(MT.ATTN_Q_A):
            w |= {"q_a": t(MT.ATTN_Q_A), "q_a_norm": t(MT.ATTN_Q_A_NORM), "q_b": t(MT.ATTN_Q_B)}
        else:
            w["q"] = t(MT.ATTN_Q)
        return LatentAttention(w | decompression(t), spec.attention, self.hp.eps, self.layer_kv_rank(spec.index))

    def check_latent_shapes(self) -> None:
        """Every latent-attention tensor against the heads, head sizes and ranks of the metadata."""
        hidden, rope_dim = self.hp.hidden, self.trunk_rope.dim
        q_rank = int(self.key(Keys.Attention.Q_LORA_RANK, 0))
        for spec in (s for s in self.specs if s.mixer == "latent_attention"):
            a, nope = spec.attention, spec.attention.key_dim - rope_dim
            rank, value_dim = self.layer_kv_rank(spec.index), a.value_dim
            if nope < 1:
                raise UserError(f"{self.gguf.path}: head size {a.key_dim} leaves no room beside the RoPE part "
                                f"({rope_dim}) of latent attention")

            def name(kind, i=spec.index):
                return f"blk.{i}.{kind}.weight"
            lite = name("attn_q") in self.gguf.tensors
            checks = [("attn_kv_a_mqa", (rank + rope_dim, hidden), "kv_lora_rank + rope dim x embedding_length"),
                      ("attn_kv_a_norm", (rank,), "kv_lora_rank"),
                      ("attn_output", (hidden, a.n_head * value_dim), "embedding_length x heads x value_length_mla")]
            if lite:
                checks.append(("attn_q", (a.n_head * a.key_dim, hidden), "heads x key_length_mla x embedding_length"))
            else:
                checks += [("attn_q_a", (q_rank, hidden), "q_lora_rank x embedding_length"),
                           ("attn_q_a_norm", (q_rank,), "q_lora_rank"),
                           ("attn_q_b", (a.n_head * a.key_dim, q_rank), "heads x key_length_mla x q_lora_rank")]
            if name("attn_kv_b") in self.gguf.tensors:
                checks.append(("attn_kv_b", (a.n_head * (nope + value_dim), rank), "heads x (nope + value) x rank"))
            else:
                checks += [("attn_k_b", (a.n_head, rank, nope), "heads x kv_lora_rank x nope dim"),
                           ("attn_v_b", (a.n_head, value_dim, rank), "heads x value_length_mla x kv_lora_rank")]
            for kind, shape, why in checks:
                expect(self, name(kind), shape, why, required=True)
