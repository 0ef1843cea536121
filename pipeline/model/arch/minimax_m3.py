"""minimax-m3 (MiniMax-M3): attention with per-head QK-norm and partial NeoX RoPE, block-sparse
(MiniMax Sparse Attention) past the leading dense layers; gpt-oss's clamped SwiGLU in the dense
MLPs, the experts and the shared expert; experts routed by the file's gating function (llama.cpp
stops on a file without one) with a selection bias, the file's weight norm and scale.

MSA, as llama.cpp's graph computes it with flash attention (without it llama.cpp runs these
layers densely and warns that the output may be degraded): the keys fall into blocks of
`indexer.block_size` positions; an indexer head per KV group scores every earlier key by
q . k (q from index_q_proj per head, k one index_k_proj key, both RMS-normed and rotated as the
trunk's queries), a block scores the maximum over its keys that the query sees, the query's own
block and the `indexer.local_blocks` - 1 before it always rank first, and each query of the
group attends to the keys of its `indexer.top_k` best blocks (every earlier block while there
are no more). The indexer runs in float32 whatever the compute dtype.
"""
import math

import torch
import torch.nn.functional as F
from gguf import MODEL_TENSOR as MT
from gguf import Keys
from torch import nn

from ...errors import UserError
from .blocks import SCORE_BLOCK_BYTES, AttentionSpec, BlockwiseAttention, rms_norm
from .family import FLOAT32_TENSORS, DecoderArch, LayerSpec
from .ffn import swiglu_oai
from .loading import BlockTensors
from .rope import apply_rope
from .shapes import expect

INDEXER_BLOCK_SIZE = "{arch}.attention.indexer.block_size"
INDEXER_LOCAL_BLOCKS = "{arch}.attention.indexer.local_blocks"


class BlockSparseAttention(BlockwiseAttention):
    """Attention over the key blocks each KV group's indexer head picks: x [B, T, hidden] -> [B, T, hidden]."""

    def __init__(self, w, spec: AttentionSpec, eps: float, index_dim: int, block: int, top_blocks: int,
                 local_blocks: int):
        super().__init__(w, spec, eps)
        self.index_dim, self.block, self.top_blocks, self.local_blocks = index_dim, block, top_blocks, local_blocks

    def describe(self) -> str:
        return (f"indexer heads={self.spec.n_kv} x {self.index_dim}, blocks of {self.block}, top {self.top_blocks}, "
                f"local {self.local_blocks}, " + super().describe())

    def attend_from(self, x: torch.Tensor, q, k, v, tables) -> torch.Tensor:
        return self.attend(q, k, v, tables, self.select(x, tables))

    def probabilities(self, scores: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
        return scores.masked_fill_(~seen, -math.inf).softmax(-1)

    def select(self, x: torch.Tensor, tables) -> torch.Tensor:
        """The keys each query of each KV group may see, [B, KV, T queries, T keys] bool: those of
        its top blocks (later keys among them are masked by causality)."""
        B, T, _ = x.shape
        w, H, D, rope = self.w, self.spec.n_kv, self.index_dim, self.spec.rope
        x = x.float()
        cos, sin = tables.rope(rope, torch.float32)
        q = rms_norm(F.linear(x, w["index_q"]).view(B, T, H, D), w["index_q_norm"], self.eps).transpose(1, 2)
        k = rms_norm(F.linear(x, w["index_k"]), w["index_k_norm"], self.eps)[:, None]          # [B, 1, T, D]
        q, k = apply_rope(q, cos, sin, rope), apply_rope(k, cos, sin, rope)                   # [B, H, T, D]
        n_blocks = -(-T // self.block)
        top = min(self.top_blocks, n_blocks)
        positions = torch.arange(T, device=x.device)
        local = positions[:, None] // self.block - torch.arange(self.local_blocks, device=x.device)  # [T, local]
        selected = torch.empty(B, H, T, T, dtype=torch.bool, device=x.device)
        rows = max(1, SCORE_BLOCK_BYTES // (2 * 4 * B * H * n_blocks * self.block))
        for a in range(0, T, rows):
            b = min(a + rows, T)
            scores = (q[:, :, a:b] @ k.transpose(-1, -2)).masked_fill(positions[None, :] > positions[a:b, None],
                                                                       -math.inf)             # [B, H, b - a, T]
            scores = F.pad(scores, (0, n_blocks * self.block - T), value=-math.inf)
            blocks = scores.view(B, H, b - a, n_blocks, self.block).amax(-1)                 # [B, H, b - a, blocks]
            own = local[a:b].clamp_min(0)                                                      # [b - a, local]
            blocks.scatter_(-1, own.expand(B, H, *own.shape), math.inf)                        # always ranked first
            chosen = torch.zeros_like(blocks, dtype=torch.bool).scatter_(-1, blocks.topk(top, dim=-1).indices, True)
            selected[:, :, a:b] = chosen.repeat_interleave(self.block, dim=-1)[..., :T]
        return selected


class MinimaxM3(DecoderArch):
    packs_sequences = False    # its sparse attention ranks blocks of places in the row
    neox_rope = True
    blockwise_scores = True    # the sparse layers form their scores outside SDPA
    float32_tensors = FLOAT32_TENSORS + ("indexer.q_proj.weight", "indexer.k_proj.weight")
    honours = frozenset({Keys.LLM.EXPERT_GATING_FUNC, Keys.LLM.EXPERT_WEIGHTS_NORM, Keys.LLM.EXPERT_WEIGHTS_SCALE,
                         Keys.LLM.LEADING_DENSE_BLOCK_COUNT})

    def __init__(self, gguf):
        super().__init__(gguf)
        heads, size = int(self.key(Keys.Attention.Indexer.HEAD_COUNT)), int(self.key(Keys.Attention.Indexer.KEY_LENGTH))
        if heads != self.hp.n_kv:
            raise UserError(f"{gguf.path}: {heads} indexer heads for {self.hp.n_kv} KV heads; MiniMax Sparse "
                            f"Attention gives each KV group one")
        for i in filter(self.is_sparse, range(self.hp.n_layers)):
            for kind, shape in (("q_proj", (heads * size, self.hp.hidden)), ("k_proj", (size, self.hp.hidden)),
                                ("q_norm", (size,)), ("k_norm", (size,))):
                expect(self, f"blk.{i}.indexer.{kind}.weight", shape, "indexer heads and key_length", required=True)

    def read_gating(self) -> str:
        return self.gating_in_file(None)   # llama.cpp stops on a file without expert_gating_func

    def normalizes_expert_weights(self) -> bool:
        return self.weights_norm_in_file()

    def ffn_kind(self, i: int) -> str:
        return self.dense_then_experts(i)

    def gated_unit(self, i: int, shared: bool = False):
        return swiglu_oai   # gpt-oss's constants, in every feed-forward block

    def attention_score_bytes(self, batch: int, ctx: int, n_head: int, device: str) -> int:
        """The blockwise scores, and each KV group's selection of keys, [batch, KV, ctx, ctx] bool."""
        return super().attention_score_bytes(batch, ctx, n_head, device) + batch * self.hp.n_kv * ctx * ctx

    def is_sparse(self, i: int) -> bool:
        return i >= int(self.key(Keys.LLM.LEADING_DENSE_BLOCK_COUNT, 0))

    def mixer(self, spec: LayerSpec, t: BlockTensors) -> nn.Module:
        if not self.is_sparse(spec.index):
            return super().mixer(spec, t)
        w = self.attention_weights(spec.attention, t) | {
            "index_q": t("indexer.q_proj"), "index_k": t("indexer.k_proj"), "index_q_norm": t("indexer.q_norm"),
            "index_k_norm": t(MT.INDEXER_K_NORM)}
        return BlockSparseAttention(w, spec.attention, self.hp.eps, int(self.key(Keys.Attention.Indexer.KEY_LENGTH)),
                                    int(self.key(INDEXER_BLOCK_SIZE)), int(self.key(Keys.Attention.Indexer.TOP_K)),
                                    int(self.key(INDEXER_LOCAL_BLOCKS, 1)))
