"""deepseek32 (DeepSeek-V3.2): deepseek2's layers, their latent attention sparse (DeepSeek Sparse
Attention, as llama.cpp's graph computes it).

A lightning indexer scores every earlier key of a query: sum over its heads of
w_h relu(q_h . k) / sqrt(heads x head size), with q_h from the query latent (attn_q_a, normed) by
indexer.attn_q_b, k one key shared by the heads (indexer.attn_k, then a LayerNorm with bias,
eps 1e-6), both rotated half the width apart on their first `rope.dimension_count` values with
the trunk's RoPE, and w from indexer.proj. Each query attends to the `indexer.top_k` keys of
highest score: to every earlier key while there are no more than that (llama.cpp takes
min(top_k, cells) of a cache whose unused cells score -inf). ggml's Hadamard rotation of the
indexer's q and k leaves the scores unchanged.
"""
import functools
import math
from dataclasses import replace

import torch
import torch.nn.functional as F
from gguf import MODEL_TENSOR as MT
from gguf import Keys
from torch import nn

from .blocks import SCORE_BLOCK_BYTES, layer_norm, sdpa
from .deepseek2 import Deepseek2, LatentAttention
from .family import LayerSpec
from .loading import BlockTensors
from .rope import RopeSpec, apply_rope

INDEXER_NORM_EPS = 1e-6   # llama.cpp's f_norm_eps for this family


class SparseLatentAttention(LatentAttention):
    """Latent attention over the keys the indexer selects: x [B, T, hidden] -> [B, T, hidden]."""

    def __init__(self, w, spec, eps: float, kv_rank: int, n_index_head: int, index_dim: int, top_k: int,
                 index_rope: RopeSpec):
        super().__init__(w, spec, eps, kv_rank)
        self.n_index_head, self.index_dim, self.top_k, self.index_rope = n_index_head, index_dim, top_k, index_rope

    def describe(self) -> str:
        return f"indexer heads={self.n_index_head} x {self.index_dim}, top_k={self.top_k}, " + super().describe()

    def forward(self, x: torch.Tensor, tables, state=None) -> torch.Tensor:
        q, k, v, q_a = self.project(x, tables)
        return self.output(self.values(self.attend_selected(q, k, v, self.select(x, q_a, tables))))

    def attend_selected(self, q, k, v, selected: torch.Tensor) -> torch.Tensor:
        """Attention of each query over its selected keys, selected [B, T, T] bool."""
        return sdpa(q, k, v, attn_mask=selected[:, None], scale=self.spec.scale)

    def select(self, x: torch.Tensor, q_a: torch.Tensor, tables) -> torch.Tensor:
        """The keys each query attends to, [B, T queries, T keys] bool: its `top_k` of highest
        indexer score among the earlier ones (all of them while there are no more)."""
        B, T, _ = x.shape
        H, D = self.n_index_head, self.index_dim
        x, q_a = x.float(), q_a.float()   # in float32 whatever the compute dtype: 16 bits would move the top-k
        q, k = self.index_queries_keys(x, q_a, tables)                              # [B, H, T, D], [B, 1, T, D]
        weights = F.linear(x, self.w["index_proj"]) * (1.0 / math.sqrt(D * H))     # [B, T, H]
        positions = torch.arange(T, device=x.device)
        causal = positions[:, None] >= positions[None, :]                            # [T, T]
        selected = causal.expand(B, T, T).clone()
        rows = max(1, SCORE_BLOCK_BYTES // (2 * 4 * B * H * T))
        for a in range(max(self.top_k, 0), T, rows):    # queries past the first top_k see more keys than it
            b = min(a + rows, T)
            scores = torch.relu(q[:, :, a:b] @ k[..., :b, :].transpose(-1, -2))     # [B, H, b - a, b]
            score = (scores * weights[:, a:b].transpose(1, 2)[..., None]).sum(1)     # [B, b - a, b]
            score = score.masked_fill(~causal[a:b, :b], -math.inf)
            selected[:, a:b, :b] = self.best(score, a)
        return selected

    def index_queries_keys(self, x: torch.Tensor, q_a: torch.Tensor, tables) -> tuple[torch.Tensor, torch.Tensor]:
        """The indexer's rotated queries [B, H, T, D] and its one key [B, 1, T, D] (LayerNorm'd), in
        float32 from x [B, T, hidden] and the query latent q_a [B, T, q_rank]."""
        B, T, _ = x.shape
        w, H, D = self.w, self.n_index_head, self.index_dim
        cos, sin = tables.rope(self.index_rope, torch.float32)
        q = apply_rope(F.linear(q_a, w["index_q_b"]).view(B, T, H, D).transpose(1, 2), cos, sin, self.index_rope)
        k = layer_norm(F.linear(x, w["index_k"]), w["index_k_norm"], INDEXER_NORM_EPS) + w["index_k_norm_bias"]
        return q, apply_rope(k[:, None], cos, sin, self.index_rope)

    def best(self, score: torch.Tensor, first: int) -> torch.Tensor:
        """score [B, queries, keys] of queries first.. (each with more earlier keys than top_k,
        the later ones -inf) -> the top_k keys of each, [B, queries, keys] bool. Where the top_k-th
        score is tied, the tied keys kept are those ggml's heap selection keeps (heap_select.py)."""
        ranked = score.topk(self.top_k + 1, dim=-1)                                    # [B, queries, k + 1]
        chosen = torch.zeros_like(score, dtype=torch.bool).scatter_(-1, ranked.indices[..., :-1], True)
        from .heap_select import heap_select

        for row, query in (ranked.values[..., -2] == ranked.values[..., -1]).nonzero().tolist():
            keys = score[row, query, :first + query + 1].tolist()   # this query's causal keys, in cell order
            chosen[row, query] = False
            chosen[row, query, heap_select(keys, self.top_k)] = True
        return chosen


class Deepseek32(Deepseek2):
    packs_sequences = False    # its indexer picks keys by their place in the row
    float32_tensors = Deepseek2.float32_tensors + ("indexer.attn_q_b.weight", "indexer.attn_k.weight",
                                                   "indexer.k_norm.bias", "indexer.proj.weight")
    honours = Deepseek2.honours | {Keys.Attention.Indexer.HEAD_COUNT, Keys.Attention.Indexer.KEY_LENGTH,
                                   Keys.Attention.Indexer.TOP_K}

    def attention_score_bytes(self, batch: int, ctx: int, n_head: int, device: str) -> int:
        """The indexer's float32 scores of a block of queries, its heads' and their sum (at most
        SCORE_BLOCK_BYTES), and each query's selection of keys, [batch, ctx, ctx] bool, SDPA's mask."""
        heads = int(self.key(Keys.Attention.Indexer.HEAD_COUNT))
        return min(2 * 4 * batch * heads * ctx * ctx, SCORE_BLOCK_BYTES) + batch * ctx * ctx

    def mixer(self, spec: LayerSpec, t: BlockTensors, cls=SparseLatentAttention) -> nn.Module:
        latent = Deepseek2.mixer(self, spec, t)
        w = dict(latent.w) | {"index_q_b": t(MT.INDEXER_ATTN_Q_B), "index_k": t(MT.INDEXER_ATTN_K),
                              "index_k_norm": t(MT.INDEXER_K_NORM), "index_k_norm_bias": t(MT.INDEXER_K_NORM, "bias"),
                              "index_proj": t(MT.INDEXER_PROJ)}
        return cls(w, spec.attention, self.hp.eps, self.kv_rank(), int(self.key(Keys.Attention.Indexer.HEAD_COUNT)),
                   int(self.key(Keys.Attention.Indexer.KEY_LENGTH)), int(self.key(Keys.Attention.Indexer.TOP_K)),
                   self.index_rope)

    @functools.cached_property
    def index_rope(self) -> RopeSpec:
        """The trunk's RoPE, half the width apart (llama.cpp's NEOX) on the first values of each
        indexer head."""
        return replace(self.trunk_rope, neox=True)
