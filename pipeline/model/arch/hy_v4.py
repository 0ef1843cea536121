"""hy_v4 (Hy4), as llama.cpp's graph computes it:

- iHC (independent hyper-connections): the residual is `hyper_connection.count` streams (the
  embedding copied into each; a boundary after layer 0 holds count x hidden values per token).
  Before each block the streams, RMS-normed together without weights, give 2 x count mixes
  (hc_*_fn): the block's input is the streams weighted by sigmoid(pre mix x scale[0] + base) + eps;
  after it stream d becomes itself + (magnitude x sigmoid(post mix_d x scale[1] + base_d) + eps) x
  the block's output, in float32. The streams never mix with each other (DeepSeek-V4's Sinkhorn
  term is absent). The head collapses them by its own mixer's pre weights, then output_norm;
- attention: deepseek2's latent attention (q_lora_rank, attn_k_b and attn_v_b required; RoPE on
  consecutive pairs; scale 1 / sqrt(key_length_mla), without YaRN's mscale), one learned sink per
  head in each softmax, and the heads' outputs times sigmoid(attn_gate x), one gate per value,
  before attn_output. Where the file sets attention.indexer.top_k, DeepSeek Sparse Attention as
  glm-dsa's (its "shared" layers attend to the keys the last "full" one before them selected,
  attention.indexer.types, which must make layer 0 full), the indexer's RoPE on the last
  `rope.dimension_count` values of each of its heads (consecutive pairs), its key's LayerNorm with
  the RMS eps; without it every query sees every earlier key;
- dense SwiGLU blocks below leading_dense_block_count, then experts routed by the file's gating
  function (llama.cpp has no default: a file without one is refused), chosen with a selection bias,
  the top-k weights renormalised as the file says and scaled; the routed experts' SwiGLU under ggml's
  swiglu_clamp (swiglu_clamp_exp), the shared expert (expert_shared_count x
  expert_feed_forward_length wide) and the dense blocks unclamped.
"""
import functools
import math

import numpy as np
import torch
import torch.nn.functional as F
from gguf import MODEL_TENSOR as MT
from gguf import Keys

from ...errors import UserError
from .blocks import SCORE_BLOCK_BYTES, BlockwiseAttention, Weights, blockwise_score_bytes, layer_norm, rms_norm
from .deepseek2 import Deepseek2, decompression
from .deepseek4 import rotate_tail
from .family import FLOAT32_TENSORS, HyperConnections, LayerSpec
from .ffn import swiglu_clamp
from .glm_dsa import INDEXER_TYPES, SharedSelectionAttention, pack_selection, unpack_selection
from .gpt_oss import SinkAttention
from .loading import BlockTensors, read_tensor
from .modules import StreamsHead, StreamsLayer
from .rope import RopeSpec
from .shapes import expect

HC_EPS = "{arch}.hyper_connection.epsilon"
HC_MAGNITUDE = "{arch}.hyper_connection.magnitude"


class IhcMixer(Weights):
    """An iHC mixer: streams [..., count, hidden] -> (the block's input [..., hidden], each stream's
    output weight [..., count]); the head's (`magnitude` None: count mixes, one scale) gives the input
    only. In float32 whatever the compute dtype, as llama.cpp's."""

    def __init__(self, fn, base, scale, eps: float, rms_eps: float, magnitude: float | None):
        super().__init__({"fn": fn, "base": base, "scale": scale})
        self.eps, self.rms_eps, self.magnitude = eps, rms_eps, magnitude

    def forward(self, h: torch.Tensor):
        n = h.shape[-2]
        mixes = F.linear(rms_norm(h.flatten(-2).float(), None, self.rms_eps), self.fn.float())   # [..., 2 n or n]
        pre = torch.sigmoid(mixes[..., :n] * self.scale[0] + self.base[:n]) + self.eps
        x = (pre[..., None] * h.float()).sum(-2).to(h.dtype)
        if self.magnitude is None:
            return (x,)
        return x, self.magnitude * torch.sigmoid(mixes[..., n:] * self.scale[1] + self.base[n:]) + self.eps


class GatedSinkLatentAttention(SharedSelectionAttention):
    """Latent attention with a sink per head and a sigmoid gate per value, over the keys its indexer
    selects, a shared layer's given selection, or (top_k 0) every earlier key:
    (x [B, T, hidden], selected [B, T, T] bool or None) -> (output, selected)."""

    probabilities = SinkAttention.probabilities

    def forward(self, x: torch.Tensor, tables, selected: torch.Tensor | None = None):
        q, k, v, q_a = self.project(x, tables)
        if self.top_k and selected is None:
            selected = self.select(x, q_a, tables)
        y = BlockwiseAttention.attend(self, q, k, v, tables, None if selected is None else selected[:, None])
        y = self.values(y)                                                        # [B, H, T, value_dim]
        B, H, T, D = y.shape
        y = y.transpose(1, 2).reshape(B, T, H * D) * torch.sigmoid(F.linear(x, self.w["gate"]))
        return F.linear(y, self.w["o"]), selected

    def index_queries_keys(self, x: torch.Tensor, q_a: torch.Tensor, tables) -> tuple[torch.Tensor, torch.Tensor]:
        """deepseek32's, but the RoPE on the last values of each head and the key's LayerNorm with the
        RMS eps."""
        B, T, _ = x.shape
        w, H, D = self.w, self.n_index_head, self.index_dim
        cos, sin = tables.rope(self.index_rope, torch.float32)
        q = rotate_tail(F.linear(q_a, w["index_q_b"]).view(B, T, H, D).transpose(1, 2), cos, sin, self.index_rope)
        k = layer_norm(F.linear(x, w["index_k"]), w["index_k_norm"], self.eps) + w["index_k_norm_bias"]
        return q, rotate_tail(k[:, None], cos, sin, self.index_rope)                # [B, H, T, D], [B, 1, T, D]


class HyV4Layer(StreamsLayer):
    """llama.cpp's hy_v4 graph, one layer: forward(x [B, T, width in]) -> [B, T, count x hidden], and
    the selection (glm_dsa.pack_selection) beside it where the next layer shares it."""

    def __init__(self, spec, eps, count: int, hidden: int, top_k: int, carried_in: bool, carried_out: bool, **parts):
        super().__init__(spec, eps, count, hidden, **parts)
        self.top_k, self.carried_in, self.carried_out = top_k, carried_in, carried_out

    def forward(self, x: torch.Tensor, tables, state=None) -> torch.Tensor:
        B, T, _ = x.shape
        x, selected = unpack_selection(x, self.top_k) if self.carried_in else (x, None)
        h = self.streams(x)                                                          # [B, T, count, hidden]
        a, post = self.attn_mixer(h)
        out, selected = self.attention(self.norm(a, self.attn_norm), tables, selected)
        h = (h.float() + post[..., None] * out.float()[..., None, :]).to(x.dtype)
        f, post = self.ffn_mixer(h)
        out = self.ffn(self.norm(f, self.ffn_norm))
        h = (h.float() + post[..., None] * out.float()[..., None, :]).to(x.dtype).reshape(B, T, -1)
        return torch.cat([h, pack_selection(selected, self.top_k, h.dtype)], dim=-1) if self.carried_out else h


class HyV4(HyperConnections, Deepseek2):
    packs_sequences = False    # its indexer picks keys by their place in the row
    fused_gate_up_experts = False   # llama.cpp's loader takes separate gate and up experts only
    blockwise_scores = True         # the sinks: scores formed outside SDPA
    sliceable_experts = False       # a layer may hand the selection on beside its output: held whole (glm-dsa's)
    float32_tensors = FLOAT32_TENSORS + ("attn_sinks.weight", "_fn.weight", "_base.weight", "_scale.weight",
                                         "indexer.attn_q_b.weight", "indexer.attn_k.weight", "indexer.k_norm.bias",
                                         "indexer.proj.weight")
    honours = frozenset({Keys.Attention.Q_LORA_RANK, Keys.Attention.KV_LORA_RANK, Keys.LLM.EXPERT_WEIGHTS_NORM,
                         Keys.LLM.EXPERT_WEIGHTS_SCALE, Keys.LLM.EXPERT_GATING_FUNC, Keys.LLM.LEADING_DENSE_BLOCK_COUNT,
                         Keys.LLM.SWIGLU_CLAMP_EXP, Keys.Attention.Indexer.HEAD_COUNT,
                         Keys.Attention.Indexer.KEY_LENGTH, Keys.Attention.Indexer.TOP_K})

    def __init__(self, gguf):
        super().__init__(gguf)
        self.top_k = int(self.key(Keys.Attention.Indexer.TOP_K, 0))
        if self.top_k:
            D, H = int(self.key(Keys.Attention.Indexer.KEY_LENGTH)), int(self.key(Keys.Attention.Indexer.HEAD_COUNT))
            if H == 0 or D <= self.trunk_rope.dim:   # llama.cpp's loader refuses these
                raise UserError(f"{gguf.path}: {H} indexer heads of {D} values: not an indexer llama.cpp computes "
                                f"(heads, and more values than the {self.trunk_rope.dim} rotated)")
            if not self.indexer_full(0):
                raise UserError(f"{gguf.path}: layer 0 shares the selection of an earlier layer, and there is none "
                                f"(attention.indexer.types)")
        self.check_own_shapes()

    def read_gating(self) -> str:
        return self.gating_in_file(None)   # llama.cpp has no default for hy_v4

    def attention_scale(self) -> float:
        return 1.0 / math.sqrt(self.hp.head_dim)   # diff: llama.cpp's hy_v4 kq_scale has no YaRN mscale

    def yarn_mscales(self) -> tuple[float, float]:
        return 1.0, 0.0   # rope.scaling.yarn_log_mul not read

    def indexer_full(self, i: int) -> bool:
        """llama.cpp: the layers attention.indexer.types marks; none where the file has no such key."""
        types = self.gguf.arch_value(INDEXER_TYPES)
        if types is None:
            return False
        return bool(types[i]) if isinstance(types, (np.ndarray, list)) else bool(types)

    def carries_selection(self, cut: int) -> bool:
        """Whether the boundary before layer `cut` holds the selection of the full layer before it."""
        return self.top_k > 0 and 0 < cut < self.hp.n_layers and not self.indexer_full(cut)

    def boundary_width(self, cut: int) -> int:
        return super().boundary_width(cut) + (2 * self.top_k if self.carries_selection(cut) else 0)

    def attention_score_bytes(self, batch: int, ctx: int, n_head: int, device: str) -> int:
        """The sinks' blocks of float32 scores (BlockwiseAttention) or, before them, the indexer's of a
        block of queries (at most SCORE_BLOCK_BYTES each, never alive together), and with DSA each query's
        selection, [batch, ctx, ctx] bool, which the attention reads."""
        scores = blockwise_score_bytes(batch, ctx, n_head)
        if not self.top_k:
            return scores
        heads = int(self.key(Keys.Attention.Indexer.HEAD_COUNT))
        return max(scores, min(2 * 4 * batch * heads * ctx * ctx, SCORE_BLOCK_BYTES)) + batch * ctx * ctx

    @functools.cached_property
    def index_rope(self) -> RopeSpec:
        return self.trunk_rope   # consecutive pairs, on the tail of each indexer head (rotate_tail)

    def check_own_shapes(self) -> None:
        """The head, iHC, sink, gate, shared-expert and indexer tensors against the metadata (the latent
        attention's: deepseek2's check)."""
        n, H, heads, value = self.count, self.hp.hidden, self.hp.n_head, self.value_dim()
        for kind, shape in (("output_hc_fn", (n, n * H)), ("output_hc_base", (n,)), ("output_hc_scale", (1,))):
            expect(self, kind + ".weight", shape, "hyper_connection.count x embedding_length", required=True)
        expect(self, "output.weight", (self.hp.vocab, H), "tokens x embedding_length (hy_v4 has no tied head)",
               required=True)
        Hi, Di = (int(self.key(k, 0)) for k in (Keys.Attention.Indexer.HEAD_COUNT, Keys.Attention.Indexer.KEY_LENGTH))
        q_rank = int(self.key(Keys.Attention.Q_LORA_RANK))
        shared = int(self.key(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH)) * int(self.key(Keys.LLM.EXPERT_SHARED_COUNT))
        for i in range(self.hp.n_layers):
            p = f"blk.{i}."
            checks = [(f"hc_{b}_{kind}", shape, "hyper_connection.count x embedding_length")
                      for b in ("attn", "ffn") for kind, shape in (("fn", (2 * n, n * H)), ("base", (2 * n,)),
                                                                   ("scale", (2,)))]
            checks += [("attn_sinks", (heads,), "head_count"),
                       ("attn_gate", (heads * value, H), "heads x value_length_mla x embedding_length")]
            if self.specs[i].ffn == "moe":
                why = "expert_shared_count x expert_feed_forward_length"
                checks += [("ffn_up_shexp", (shared, H), why), ("ffn_gate_shexp", (shared, H), why),
                           ("ffn_down_shexp", (H, shared), why)]
            if self.top_k and self.indexer_full(i):
                why = "indexer heads x key_length"
                checks += [("indexer.attn_q_b", (Hi * Di, q_rank), why), ("indexer.attn_k", (Di, H), why),
                           ("indexer.k_norm", (Di,), why), ("indexer.proj", (Hi, H), why)]
                expect(self, p + "indexer.k_norm.bias", (Di,), why, required=True)
            for kind, shape, why in checks:
                expect(self, p + kind + ".weight", shape, why, required=True)

    def mixer(self, spec: LayerSpec, t: BlockTensors) -> GatedSinkLatentAttention:
        w = {"q_a": t(MT.ATTN_Q_A), "q_a_norm": t(MT.ATTN_Q_A_NORM), "q_b": t(MT.ATTN_Q_B),
             "kv_a": t(MT.ATTN_KV_A_MQA), "kv_a_norm": t(MT.ATTN_KV_A_NORM), **decompression(t),
             "o": t(MT.ATTN_OUT), "gate": t(MT.ATTN_GATE), "sinks": t(MT.ATTN_SINKS)}
        index = (0, 0)
        if self.top_k and self.indexer_full(spec.index):
            w |= {"index_q_b": t(MT.INDEXER_ATTN_Q_B), "index_k": t(MT.INDEXER_ATTN_K),
                  "index_k_norm": t(MT.INDEXER_K_NORM), "index_k_norm_bias": t(MT.INDEXER_K_NORM, "bias"),
                  "index_proj": t(MT.INDEXER_PROJ)}
            index = (int(self.key(Keys.Attention.Indexer.HEAD_COUNT)), int(self.key(Keys.Attention.Indexer.KEY_LENGTH)))
        return GatedSinkLatentAttention(w, spec.attention, self.hp.eps, self.kv_rank(), *index, self.top_k,
                                        self.index_rope)

    def ihc(self, t: BlockTensors, prefix: str) -> IhcMixer:
        return IhcMixer(t(f"{prefix}_fn"), t(f"{prefix}_base"), t(f"{prefix}_scale"), float(self.key(HC_EPS)),
                        self.hp.eps, float(self.key(HC_MAGNITUDE)))

    def layer(self, spec: LayerSpec, t: BlockTensors) -> HyV4Layer:
        i = spec.index
        return HyV4Layer(spec, self.hp.eps, self.count, self.hp.hidden, self.top_k, self.carries_selection(i),
                         self.carries_selection(i + 1), attn_mixer=self.ihc(t, "hc_attn"), attn_norm=t(MT.ATTN_NORM),
                         attention=self.mixer(spec, t), ffn_mixer=self.ihc(t, "hc_ffn"), ffn_norm=t(MT.FFN_NORM),
                         ffn=self.ffn(spec, t))

    def gated_unit(self, i: int, shared: bool = False):
        """ggml's swiglu_clamp at swiglu_clamp_exp on the routed experts; the shared and dense blocks unclamped."""
        limit = 0.0 if shared else float(self.layer_key(Keys.LLM.SWIGLU_CLAMP_EXP, i, 0.0))
        return functools.partial(swiglu_clamp, limit=limit) if limit > 1e-6 else None

    def load_head(self, device, dtype) -> StreamsHead:
        def held(name):
            return read_tensor(self.gguf, name, device, torch.promote_types(dtype, torch.float32))

        mixer = IhcMixer(*(held(f"output_hc_{kind}.weight") for kind in ("fn", "base", "scale")),
                         float(self.key(HC_EPS)), self.hp.eps, None)
        return StreamsHead(mixer, held("output_norm.weight"), read_tensor(self.gguf, "output.weight", device, dtype),
                           self.hp.eps, self.count)
