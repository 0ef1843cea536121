"""dots3note (dots3, 288B-A19B): deepseek32's layers with two latent-attention geometries.

Sliding layers (attention.sliding_window_pattern) attend within attention.sliding_window at
rope.freq_base_swa, with their own head count (head_count per layer), kv_lora_rank_swa,
key_length_mla_swa and value_length_mla_swa, and no indexer; the others are full: the file's MLA
geometry and DeepSeek Sparse Attention (deepseek32's indexer, its RoPE half the width apart at the
trunk's base, on every full layer: attention.indexer.types says which). On both, the shared RoPE key is
RMS-normed (attn_k_norm) before RoPE, and sigmoid(attn_gate x), one gate a head, scales each head's
output before attn_output, x the normed layer input; Q.K is scaled by 1 / sqrt(the layer's
key_length_mla), whatever the RoPE. Leading dense SwiGLU blocks, then experts routed by the file's
gating function with a selection bias, the file's weight norm and scale, beside expert_shared_count
shared experts of the expert width. The multi-token-prediction block after the trunk is not run
(llama.cpp loads and skips it).

As llama.cpp's loader reads it, every one of these keys and tensors is required, queries come from the
latent (q_lora_rank) and the indexer's heads are at least the rotated width. RoPE scaling is refused.
"""
import math
from dataclasses import replace

import numpy as np
import torch
import torch.nn.functional as F
from gguf import MODEL_TENSOR as MT
from gguf import Keys

from ...errors import UserError
from .blocks import AttentionSpec
from .deepseek2 import Deepseek2, LatentAttention
from .deepseek32 import Deepseek32, SparseLatentAttention
from .family import DecoderArch, LayerSpec
from .loading import BlockTensors
from .shapes import expect

KV_LORA_RANK_SWA = "{arch}.attention.kv_lora_rank_swa"
KEY_LENGTH_MLA_SWA = "{arch}.attention.key_length_mla_swa"
VALUE_LENGTH_MLA_SWA = "{arch}.attention.value_length_mla_swa"
INDEXER_TYPES = "{arch}.attention.indexer.types"


class GatedLatentAttention(LatentAttention):
    """Latent attention (its RoPE key normed by `k_pe_norm`) whose heads' outputs are scaled by
    sigmoid(`gate` x), one gate a head, before the output projection."""

    def forward(self, x: torch.Tensor, tables, state=None) -> torch.Tensor:
        q, k, v, q_a = self.project(x, tables)
        return self.gated_output(x, self.values(self.attend(q, k, v, tables)))

    def gated_output(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """y [B, H, T, value_dim] scaled per head by sigmoid(gate x) -> [B, T, hidden]."""
        gate = torch.sigmoid(F.linear(x, self.w["gate"]))                           # [B, T, H]
        return self.output(y * gate.transpose(1, 2)[..., None])


class GatedSparseLatentAttention(SparseLatentAttention, GatedLatentAttention):
    """A full layer's: over the indexer's selection, and gated."""

    def forward(self, x: torch.Tensor, tables, state=None) -> torch.Tensor:
        q, k, v, q_a = self.project(x, tables)
        return self.gated_output(x, self.values(self.attend_selected(q, k, v, self.select(x, q_a, tables))))


class Dots3Note(Deepseek32):
    fused_gate_up_experts = False   # llama.cpp's loader reads ffn_gate_exps and ffn_up_exps only
    honours = (Deepseek32.honours - {Keys.Rope.SCALING_YARN_LOG_MUL}) | {
        Keys.Attention.SLIDING_WINDOW, Keys.Attention.SLIDING_WINDOW_PATTERN}

    def read_gating(self) -> str:
        return self.gating_in_file(None)   # llama.cpp's loader requires expert_gating_func

    def attention_scale(self) -> float:
        return DecoderArch.attention_scale(self)   # llama.cpp's kq_scale: 1 / sqrt(head size), no YaRN factor

    def is_sliding(self, i: int) -> bool:
        return bool(np.asarray(self.key(Keys.Attention.SLIDING_WINDOW_PATTERN))[i])   # llama.cpp requires the array

    def ffn_kind(self, i: int) -> str:
        self.key(Keys.LLM.LEADING_DENSE_BLOCK_COUNT)   # required by llama.cpp's loader
        return super().ffn_kind(i)

    def layer_kv_rank(self, i: int) -> int:
        return int(self.key(KV_LORA_RANK_SWA)) if self.is_sliding(i) else self.kv_rank()

    def attention_spec(self, i: int) -> AttentionSpec:
        spec = super().attention_spec(i)
        if not self.is_sliding(i):
            return spec
        self.key(Keys.Rope.FREQ_BASE_SWA)   # required by llama.cpp's loader
        key_dim = int(self.key(KEY_LENGTH_MLA_SWA))
        return self.sliding(replace(spec, key_dim=key_dim, value_dim=int(self.key(VALUE_LENGTH_MLA_SWA)),
                                    scale=1.0 / math.sqrt(key_dim)))

    def mixer(self, spec: LayerSpec, t: BlockTensors) -> LatentAttention:
        i = spec.index
        w = dict(Deepseek2.mixer(self, spec, t).w) | {"k_pe_norm": t(MT.ATTN_K_NORM), "gate": t(MT.ATTN_GATE)}
        if self.is_sliding(i):
            return GatedLatentAttention(w, spec.attention, self.hp.eps, self.layer_kv_rank(i))
        w |= {"index_q_b": t(MT.INDEXER_ATTN_Q_B), "index_k": t(MT.INDEXER_ATTN_K),
              "index_k_norm": t(MT.INDEXER_K_NORM), "index_k_norm_bias": t(MT.INDEXER_K_NORM, "bias"),
              "index_proj": t(MT.INDEXER_PROJ)}
        return GatedSparseLatentAttention(w, spec.attention, self.hp.eps, self.layer_kv_rank(i),
                                          int(self.key(Keys.Attention.Indexer.HEAD_COUNT)),
                                          int(self.key(Keys.Attention.Indexer.KEY_LENGTH)),
                                          int(self.key(Keys.Attention.Indexer.TOP_K)), self.index_rope)

    def check_latent_shapes(self) -> None:
        """deepseek2's checks per layer kind; what llama.cpp's loader and graph refuse; the norm, gate,
        indexer and shared-expert tensors against the metadata (all required)."""
        path, arch, hidden, rope = self.gguf.path, self.gguf.architecture, self.hp.hidden, self.trunk_rope
        if not self.latent:
            raise UserError(f"{path}: {arch}.attention.key_length_mla is missing; llama.cpp's loader requires MLA")
        if rope.yarn is not None or rope.scale != 1.0:
            raise UserError(f"{path}: RoPE scaling is not computed by layercycle for {arch}")
        super().check_latent_shapes()
        q_rank = int(self.key(Keys.Attention.Q_LORA_RANK))
        index_heads, index_dim = (int(self.key(k)) for k in (Keys.Attention.Indexer.HEAD_COUNT,
                                                              Keys.Attention.Indexer.KEY_LENGTH))
        if rope.dim > index_dim:   # llama.cpp's graph asserts it: the indexer's heads are [rope | nope]
            raise UserError(f"{path}: rope.dimension_count {rope.dim} is wider than the indexer's heads ({index_dim})")
        types = np.asarray(self.key(INDEXER_TYPES))
        shared = int(self.key(Keys.LLM.EXPERT_SHARED_COUNT)) * int(self.key(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH))
        for spec in self.specs:
            i, a = spec.index, spec.attention
            if bool(types[i]) == self.is_sliding(i):
                raise UserError(f"{path}: layer {i} is {'sliding' if self.is_sliding(i) else 'full'} but "
                                f"{INDEXER_TYPES.format(arch=arch)} says {'full' if types[i] else 'none'}; llama.cpp "
                                f"runs the indexer on every full layer and on no sliding one")
            checks = {"attn_q_a": (q_rank, hidden), "attn_k_b": (a.n_head, self.layer_kv_rank(i), a.key_dim - rope.dim),
                      "attn_k_norm": (rope.dim,), "attn_gate": (a.n_head, hidden)}
            if not self.is_sliding(i):
                checks |= {"indexer.attn_q_b": (index_heads * index_dim, q_rank), "indexer.attn_k": (index_dim, hidden),
                           "indexer.k_norm": (index_dim,), "indexer.proj": (index_heads, hidden)}
                expect(self, f"blk.{i}.indexer.k_norm.bias", (index_dim,), "indexer.key_length", required=True)
            if spec.ffn == "moe":
                checks |= {"ffn_up_shexp": (shared, hidden), "ffn_gate_shexp": (shared, hidden),
                           "ffn_down_shexp": (hidden, shared)}
                expect(self, f"blk.{i}.exp_probs_b.bias", (int(self.key(Keys.LLM.EXPERT_COUNT)),), "expert_count",
                       required=True)
            for kind, shape in checks.items():
                expect(self, f"blk.{i}.{kind}.weight", shape, "the layer kind's heads, head sizes and ranks",
                       required=True)
            for kind in ("ffn_gate_exps",) if spec.ffn == "moe" else ("ffn_gate",):   # optional in DecoderArch
                if f"blk.{i}.{kind}.weight" not in self.gguf.tensors:
                    raise UserError(f"{path}: missing tensor blk.{i}.{kind}.weight")
