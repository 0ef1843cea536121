"""deepseek4 (DeepSeek-V4), as llama.cpp's graph computes it:

- hyper-connections: the residual is `hyper_connection.count` streams (the embedding copied into
  each; a boundary after layer 0 holds count x hidden values per token). Before each block the
  streams, RMS-normed together, give mixes: the block's input is the streams weighted by
  sigmoid(pre) + eps, and after it stream d becomes 2 sigmoid(post_d) x the block's output plus
  the streams mixed by a Sinkhorn-normalised matrix (a softmax over d, then `sinkhorn_iterations`
  alternating column and row normalisations, eps in each sum). The head collapses the streams
  by the pre weights alone, then the output norm;
- attention: queries from a normed latent (attn_q_a, attn_q_b), RMS-normed per head without
  weights; one key/value head (attn_kv, normed), the last `rope.dimension_count` values of each
  rotated on consecutive pairs; learned sinks; over the keys of a sliding window and, by the
  layer's compress ratio, compressed entries: 128 keys each, all of them once complete (heavily
  compressed attention), or 4 keys each with the 4 before them overlapping (two halves of the
  compressor's width), those an indexer picks (compressed sparse attention: sum over its heads of
  w_h relu(q_h . k), its own compressor's entries, its top `indexer.top_k`, ggml's heap breaking
  ties). An entry is a softmax-weighted sum of its keys' values per channel (the gates plus a
  position bias `ape`), normed, rotated at its first key's position. Layers with a compress ratio
  rotate with `attention.compress_rope_freq_base` and the file's YaRN (its attention factor
  cancelled, as llama.cpp sets it); the others with the trunk's base, unscaled. The output is
  rotated back at the query's position and projected in `attention.output_group_count` groups of
  rank `output_lora_rank`, then to the hidden size;
- experts routed by sqrt(softplus(logits)), chosen with a selection bias, or on the first
  `hash_layer_count` layers by the token's id (ffn_gate_tid2eid); SwiGLU with ggml's clamp
  (swiglu_clamp_exp, _shexp) in the experts and the shared expert.
"""
import functools
import math
from dataclasses import replace

import numpy as np
import torch
import torch.nn.functional as F
from gguf import MODEL_TENSOR as MT
from gguf import Keys
from torch import nn

from ...errors import UserError
from .blocks import SCORE_BLOCK_BYTES, Weights, rms_norm, wide
from .family import COMPRESS_RATIOS, FLOAT32_TENSORS, DecoderArch, HyperConnections, LayerSpec
from .ffn import MLP, MoE, Routed, expert_scores, normalized, swiglu_clamp
from .loading import BlockTensors, read_tensor
from .modules import StreamsHead, StreamsLayer
from .rope import RopeSpec, apply_rope, read_rope
from .shapes import expect

HC_SINKHORN = "{arch}.hyper_connection.sinkhorn_iterations"
HC_EPS = "{arch}.hyper_connection.epsilon"
HASH_LAYERS = "{arch}.hash_layer_count"
OUT_GROUPS = "{arch}.attention.output_group_count"
OUT_RANK = "{arch}.attention.output_lora_rank"
COMPRESS_BASE = "{arch}.attention.compress_rope_freq_base"
SPARSE, HEAVY = 4, 128   # the compress ratios llama.cpp computes: indexed (overlapping) and all entries
SCORE_COPIES = 5         # float32 score tensors of a block of queries alive at once (masked, with sinks, softmax)


class SinkhornMixer(Weights):
    """A DeepSeek-V4 mixer: streams [..., count, hidden] -> (the block's input [..., hidden], each
    stream's output weight [..., count], the streams' mixing [..., count src, count dst]); the
    head's (one scale, `count` mixes) gives the input only."""

    def __init__(self, fn, base, scale, eps: float, rms_eps: float, iterations: int):
        super().__init__({"fn": fn, "base": base, "scale": scale})
        self.eps, self.rms_eps, self.iterations = eps, rms_eps, iterations

    def forward(self, streams: torch.Tensor):
        n = streams.shape[-2]
        flat = wide(streams).flatten(-2)                                                 # [..., n H]
        mixes = F.linear(rms_norm(flat, None, self.rms_eps), self.fn)                    # [..., mixes]
        pre = torch.sigmoid(mixes[..., :n] * self.scale[0] + self.base[:n]) + self.eps
        mixed = (wide(streams) * pre[..., None]).sum(-2).to(streams.dtype)               # [..., H]
        if mixes.shape[-1] == n:
            return mixed, None, None
        post = 2 * torch.sigmoid(mixes[..., n:2 * n] * self.scale[1] + self.base[n:2 * n])
        comb = (mixes[..., 2 * n:] * self.scale[2] + self.base[2 * n:]).unflatten(-1, (n, n))   # [..., src, dst]
        return mixed, post, self.sinkhorn(comb)

    def sinkhorn(self, comb: torch.Tensor) -> torch.Tensor:
        """llama.cpp's: a softmax over dst, then columns (over src) normalised, then rows and
        columns in turn, eps added to each sum."""
        comb = comb.softmax(-1) + self.eps
        comb = comb / (comb.sum(-2, keepdim=True) + self.eps)
        for _ in range(1, self.iterations):
            comb = comb / (comb.sum(-1, keepdim=True) + self.eps)
            comb = comb / (comb.sum(-2, keepdim=True) + self.eps)
        return comb


def write_back(streams: torch.Tensor, out: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """Stream d after a block: post_d x the block's output [..., hidden] + sum over s of
    comb[s, d] x stream s (streams [..., count, hidden])."""
    mixed = torch.einsum("...sd,...sh->...dh", comb, wide(streams))
    return (mixed + post[..., None] * wide(out)[..., None, :]).to(streams.dtype)


def rotate_tail(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rope: RopeSpec) -> torch.Tensor:
    """x [..., T, D] with its last rope.dim values rotated (ggml_rope_set_offset's)."""
    head, tail = x[..., :x.shape[-1] - rope.dim], x[..., x.shape[-1] - rope.dim:]
    return torch.cat([head, apply_rope(tail, cos, sin, rope)], dim=-1)


def compress(x: torch.Tensor, w: dict, prefix: str, ratio: int, eps: float) -> torch.Tensor:
    """The compressed entries of x [B, T, hidden]: [B, T // ratio, width], before their rotation;
    at ratio 4 each entry also takes the first half of the channels of the 4 keys before it."""
    B, T, _ = x.shape
    n = T // ratio
    if n == 0:   # no entry complete yet
        return x.new_zeros(B, 0, w[prefix + "norm"].shape[0], dtype=torch.float32)
    kv = F.linear(x, w[prefix + "kv"])[:, :n * ratio].float()                           # [B, n r, C]
    gate = F.linear(x, w[prefix + "gate"])[:, :n * ratio].float() + w[prefix + "ape"].repeat(n, 1)
    kv, gate = kv.view(B, n, ratio, kv.shape[-1]), gate.view(B, n, ratio, kv.shape[-1])  # [B, n, r, C]
    if ratio == SPARSE:   # this block's second half of the channels, the block before's first half
        C = kv.shape[-1] // 2
        kv = torch.cat([F.pad(kv[:, :-1, :, :C], (0, 0, 0, 0, 1, 0)), kv[..., C:]], dim=2)
        gate = torch.cat([F.pad(gate[:, :-1, :, :C], (0, 0, 0, 0, 1, 0), value=-math.inf), gate[..., C:]], dim=2)
    entries = (kv * gate.softmax(dim=2)).sum(2)                                          # [B, n, width]
    return rms_norm(entries, w[prefix + "norm"], eps)


class CompressedAttention(Weights):
    """DeepSeek-V4's attention of one layer: x [B, T, hidden] -> [B, T, hidden]."""

    def __init__(self, w, n_head: int, head_dim: int, eps: float, window: int, ratio: int, rope: RopeSpec,
                 groups: int, index_heads: int = 0, index_dim: int = 0, top_k: int = 0):
        super().__init__(w)
        self.n_head, self.head_dim, self.eps, self.window = n_head, head_dim, eps, window
        self.ratio, self.rope = ratio, rope
        self.groups, self.index_heads, self.index_dim, self.top_k = groups, index_heads, index_dim, top_k

    def describe(self) -> str:
        kind = {0: "window only", HEAVY: f"all entries of {HEAVY}",
                SPARSE: f"top {self.top_k} entries of {SPARSE} ({self.index_heads} indexer heads x {self.index_dim})"}
        return (f"heads={self.n_head} x {self.head_dim}, window={self.window}, {kind[self.ratio]}, "
                f"rope dim={self.rope.dim} base={self.rope.base:g}, output groups={self.groups}")

    def forward(self, x: torch.Tensor, tables, state=None) -> torch.Tensor:
        B, T, _ = x.shape
        w, H, D = self.w, self.n_head, self.head_dim
        cos, sin = tables.rope(self.rope, torch.float32)                                 # [T, dim / 2]
        latent = rms_norm(F.linear(x, w["q_a"]), w["q_a_norm"], self.eps)
        q = rms_norm(F.linear(latent, w["q_b"]).view(B, T, H, D), None, self.eps).transpose(1, 2)
        q = rotate_tail(q.float(), cos, sin, self.rope)                                  # [B, H, T, D]
        kv = rotate_tail(rms_norm(F.linear(x, w["kv"]), w["kv_norm"], self.eps).float(), cos, sin, self.rope)
        entries, seen = x.new_zeros(B, 0, D, dtype=torch.float32), None                  # [B, T, D] keys
        if self.ratio:
            at = slice(None, T // self.ratio * self.ratio, self.ratio)   # each entry rotated at its first key
            entries = rotate_tail(compress(x, w, "comp_", self.ratio, self.eps), cos[at], sin[at], self.rope)
            seen = self.select(x, latent, tables) if self.ratio == SPARSE else None
        y = self.attend(q, kv, entries, seen)                                            # [B, H, T, D]
        y = rotate_tail(y, cos, -sin, self.rope).transpose(1, 2)                         # rotated back
        G = self.groups
        y = torch.einsum("btgi,gri->btgr", y.reshape(B, T, G, H * D // G).to(x.dtype),
                         w["o_a"].view(G, -1, H * D // G))                               # [B, T, G, rank]
        return F.linear(y.reshape(B, T, -1), w["o_b"])

    def attend(self, q: torch.Tensor, kv: torch.Tensor, entries: torch.Tensor, seen: torch.Tensor | None):
        """Softmax (with the head's sink) of q [B, H, T, D] over the window's keys kv [B, T, D] and the
        entries [B, n, D] each query sees (the complete ones; `seen` [B, T, n]: those picked), in
        float32, a block of queries at a time; the keys are the values."""
        B, H, T, D = q.shape
        n = entries.shape[1]
        positions = torch.arange(T, device=q.device)
        complete = (positions[:, None] + 1) // self.ratio > torch.arange(n, device=q.device) if self.ratio else None
        sinks = self.w["sinks"].float().view(1, H, 1, 1)
        rows = max(1, SCORE_BLOCK_BYTES // (SCORE_COPIES * 4 * B * H * (T + n)))
        out = []
        for a in range(0, T, rows):
            b = min(a + rows, T)
            lo = max(0, a - self.window + 1)
            keys = torch.cat([kv[:, lo:b], entries], dim=1)                              # [B, keys, D]
            scores = q[:, :, a:b] @ keys[:, None].transpose(-1, -2) / math.sqrt(D)      # [B, H, b - a, keys]
            lag = positions[a:b, None] - positions[None, lo:b]
            visible = ((lag >= 0) & (lag < self.window)).expand(B, -1, -1)               # [B, b - a, window keys]
            if n:
                picked = complete[a:b].expand(B, -1, -1) if seen is None else complete[a:b] & seen[:, a:b]
                visible = torch.cat([visible, picked], dim=-1)
            scores = scores.masked_fill(~visible[:, None], -math.inf)
            p = torch.cat([scores, sinks.expand(B, H, b - a, 1)], dim=-1).softmax(-1)[..., :-1]
            out.append(p @ keys[:, None])                                                # [B, H, b - a, D]
        return torch.cat(out, dim=2)

    def select(self, x: torch.Tensor, latent: torch.Tensor, tables) -> torch.Tensor:
        """The entries each query attends to, [B, T, n] bool: its indexer's top_k of the complete
        ones (all while there are no more), in float32."""
        B, T, _ = x.shape
        w, H, D = self.w, self.index_heads, self.index_dim
        cos, sin = tables.rope(self.rope, torch.float32)
        q = rotate_tail(F.linear(latent.float(), w["index_q_b"]).view(B, T, H, D).transpose(1, 2), cos, sin, self.rope)
        at = slice(None, T // SPARSE * SPARSE, SPARSE)
        k = rotate_tail(compress(x.float(), w, "index_", SPARSE, self.eps), cos[at], sin[at], self.rope)   # [B, n, D]
        weights = (F.linear(x.float(), w["index_proj"]) * (1.0 / math.sqrt(D * H))).transpose(1, 2)   # [B, H, T]
        n = k.shape[1]
        scores = torch.empty(B, T, n, dtype=torch.float32, device=x.device)
        rows = max(1, SCORE_BLOCK_BYTES // (2 * 4 * B * H * max(n, 1)))
        for a in range(0, T, rows):   # a block of queries' heads at a time
            b = min(a + rows, T)
            per_head = torch.relu(q[:, :, a:b] @ k[:, None].transpose(-1, -2))          # [B, H, b - a, n]
            scores[:, a:b] = (per_head * weights[:, :, a:b, None]).sum(1)
        visible = ((torch.arange(T) + 1) // SPARSE).expand(B, T).contiguous()           # [B, T] entries complete
        selected = np.zeros(scores.shape, dtype=np.bool_)
        from .heap_select import select_top_k

        select_top_k(scores.cpu().numpy().reshape(B * T, -1), visible.numpy().reshape(-1), self.top_k,
                     selected.reshape(B * T, -1))
        return torch.from_numpy(selected).to(x.device)


class HashRoutedMoE(MoE):
    """Experts chosen by the token's id (ffn_gate_tid2eid [vocab, k]), weighted as the router's
    scores of them: forward(x [B, T, hidden], ids [B, T]) -> [B, T, hidden]."""

    def __init__(self, table: torch.Tensor, **kw):
        super().__init__(**kw)
        self.register_buffer("table", table, persistent=False)

    def route(self, flat: torch.Tensor, ids: torch.Tensor) -> Routed:
        # flat [N, hidden], ids [B, T] of the same tokens
        experts = self.table[ids.reshape(-1).to(self.table.device)].long()              # [N, k]
        scores = expert_scores(F.linear(wide(flat), self.router), self.routing.gating)    # [N, E]
        return Routed.of(normalized(scores.gather(-1, experts), self.routing), experts, self.experts.n_experts)


class Deepseek4Layer(StreamsLayer):
    """llama.cpp's deepseek4 graph, one layer: forward(x [B, T, width in], tables, state, the token
    ids [B, T] on a hash-routed layer) -> [B, T, count x hidden]."""

    def forward(self, x: torch.Tensor, tables, state=None, token_input: torch.Tensor | None = None) -> torch.Tensor:
        B, T, _ = x.shape
        h = self.streams(x)                                                              # [B, T, count, hidden]
        a, post, comb = self.attn_mixer(h)
        h = write_back(h, self.attention(self.norm(a, self.attn_norm), tables), post, comb)
        f, post, comb = self.ffn_mixer(h)
        f = self.norm(f, self.ffn_norm)
        h = write_back(h, self.moe(f, token_input), post, comb)   # the ids: read by a hash-routed layer
        return h.reshape(B, T, -1)


class TokenIds(nn.Module):
    """The token ids themselves, for the hash-routed layers among [first, last)."""

    def __init__(self, layers: list[int]):
        super().__init__()
        self.layers = layers

    def forward(self, ids: torch.Tensor) -> dict[int, torch.Tensor]:
        return {i: ids for i in self.layers}


class Deepseek4(HyperConnections, DecoderArch):
    packs_sequences = False    # its compressed and sparse attention group keys by their place in the row
    blockwise_scores = True   # sinks, windows and entries: scores formed outside SDPA
    float32_tensors = FLOAT32_TENSORS + ("attn_sinks.weight", "_fn.weight", "_base.weight", "_scale.weight",
                                         "_ape.weight", "indexer.attn_q_b.weight", "indexer.proj.weight",
                                         "indexer_compressor_kv.weight", "indexer_compressor_gate.weight")
    honours = frozenset({Keys.LLM.EXPERT_GATING_FUNC, Keys.LLM.EXPERT_WEIGHTS_NORM, Keys.LLM.EXPERT_WEIGHTS_SCALE,
                         Keys.LLM.SWIGLU_CLAMP_EXP, Keys.LLM.SWIGLU_CLAMP_SHEXP, Keys.Attention.SLIDING_WINDOW,
                         Keys.Attention.Q_LORA_RANK, Keys.Attention.Indexer.HEAD_COUNT,
                         Keys.Attention.Indexer.KEY_LENGTH, Keys.Attention.Indexer.TOP_K})

    def __init__(self, gguf):
        super().__init__(gguf)
        self.check_own_shapes()
        hashed = int(self.key(HASH_LAYERS, 0))
        self.hash_layers = list(range(min(hashed, self.hp.n_layers)))
        self.takes_token_ids = bool(self.hash_layers)

    def held_dtype(self, name: str, dtype: torch.dtype) -> torch.dtype:
        """The hash layers' expert ids as the file's int32."""
        return torch.int32 if name.endswith("tid2eid.weight") else super().held_dtype(name, dtype)

    def read_gating(self) -> str:
        gating = self.gating_in_file(None)
        if gating != "sqrt_softplus":
            raise UserError(f"{self.gguf.path}: expert_gating_func is {gating}; llama.cpp computes DeepSeek-V4 "
                            f"only with sqrt-softplus routing, and so does layercycle")
        return gating

    def normalizes_expert_weights(self) -> bool:
        return self.weights_norm_in_file()

    def compress_ratio(self, i: int) -> int:
        ratio = int(self.layer_key(COMPRESS_RATIOS, i))
        if ratio not in (0, SPARSE, HEAVY):
            raise UserError(f"{self.gguf.path}: layer {i} has compress ratio {ratio}; llama.cpp computes 0, "
                            f"{SPARSE} and {HEAVY}")
        return ratio

    def layer_spec(self, i: int) -> LayerSpec:
        kinds = {0: "window_attention", SPARSE: "sparse_compressed_attention", HEAVY: "compressed_attention"}
        return LayerSpec(i, kinds[self.compress_ratio(i)], "moe")

    def check_own_shapes(self) -> None:
        """The mixers', the attention's, the compressors' and the indexers' tensors against the metadata."""
        n, H, D = self.count, self.hp.hidden, self.hp.head_dim
        rank, groups, out_rank = (int(self.key(k)) for k in (Keys.Attention.Q_LORA_RANK, OUT_GROUPS, OUT_RANK))
        Hi, Di = (int(self.key(k, 0)) for k in (Keys.Attention.Indexer.HEAD_COUNT, Keys.Attention.Indexer.KEY_LENGTH))
        if self.hp.n_head % max(groups, 1) or self.hp.n_kv != 1:
            raise UserError(f"{self.gguf.path}: {self.hp.n_head} heads in {groups} output groups with "
                            f"{self.hp.n_kv} KV heads; DeepSeek-V4 has one KV head and whole groups")
        for prefix, mixes in (("output_hc", n), *((f"blk.{i}.hc_{b}", (2 + n) * n) for i in range(self.hp.n_layers)
                                                   for b in ("attn", "ffn"))):
            for kind, shape in (("fn", (mixes, n * H)), ("base", (mixes,)), ("scale", (3 if mixes > n else 1,))):
                expect(self, f"{prefix}_{kind}.weight", shape, "hyper_connection.count x embedding_length",
                       required=True)
        for i in range(self.hp.n_layers):
            p, ratio = f"blk.{i}.", self.compress_ratio(i)
            for kind, shape in (("attn_q_a", (rank, H)), ("attn_q_b", (self.hp.n_head * D, rank)), ("attn_kv", (D, H)),
                                ("attn_kv_a_norm", (D,)), ("attn_sinks", (self.hp.n_head,)),
                                ("attn_output_a", (groups * out_rank, self.hp.n_head * D // groups)),
                                ("attn_output_b", (H, groups * out_rank))):
                expect(self, p + kind + ".weight", shape, "heads, key_length, q_lora_rank and the output groups",
                       required=True)
            compressors = {"attn_compressor": D} if ratio else {}
            if ratio == SPARSE:
                compressors["indexer_compressor"] = Di
                expect(self, p + "indexer.attn_q_b.weight", (Hi * Di, rank), "indexer heads x key_length",
                       required=True)
                expect(self, p + "indexer.proj.weight", (Hi, H), "indexer heads", required=True)
            for name, width in compressors.items():
                wide_ = width * (2 if ratio == SPARSE else 1)
                for kind, shape in (("kv", (wide_, H)), ("gate", (wide_, H)), ("ape", (ratio, wide_)),
                                    ("norm", (width,))):
                    expect(self, f"{p}{name}_{kind}.weight", shape, "the compress ratio and head size", required=True)

    # -- RoPE ------------------------------------------------------------------------------------
    @functools.cached_property
    def rope_by_kind(self) -> dict[bool, RopeSpec]:
        """The RoPE of the layers without (False) and with (True) a compress ratio: the trunk's base
        unscaled; the compress base with the file's scaling, YaRN's attention factor cancelled."""
        trunk = read_rope(self, int(self.key(Keys.Rope.DIMENSION_COUNT)), False, None)
        compressed = replace(trunk, base=float(self.key(COMPRESS_BASE)), mscale=1.0)   # ggml's attn_factor 1
        if trunk.yarn is not None:
            cancelled = 1 / (1 + 0.1 * math.log(trunk.scale))   # ggml multiplies it back
            compressed = replace(compressed, yarn=replace(trunk.yarn, attn_factor=cancelled))
        return {False: RopeSpec(trunk.dim, trunk.base, neox=False), True: compressed}

    # -- what a boundary carries ---------------------------------------------------------------
    def token_inputs(self, first: int, last: int, device, dtype) -> TokenIds | None:
        layers = [i for i in self.hash_layers if first <= i < last]
        return TokenIds(layers) if layers else None

    def attention_score_bytes(self, batch: int, ctx: int, n_head: int, device: str) -> int:
        """A block of queries' float32 scores over the window and the entries (SCORE_COPIES of them, at
        most SCORE_BLOCK_BYTES), the indexer's heads' scores of a block of queries (at most
        SCORE_BLOCK_BYTES), and its summed scores and selection of the entries, [batch, ctx, ctx / 4]
        float32 and bool."""
        indexed = any(self.compress_ratio(i) == SPARSE for i in range(self.hp.n_layers))
        heads, n = int(self.key(Keys.Attention.Indexer.HEAD_COUNT, 0)), ctx // SPARSE
        entries = batch * ctx * n * (4 + 1) + min(SCORE_BLOCK_BYTES, 2 * 4 * batch * heads * ctx * n) if indexed else 0
        scores = min(SCORE_COPIES * 4 * batch * n_head * ctx * (ctx + ctx // SPARSE), SCORE_BLOCK_BYTES)
        return scores + entries

    # -- the layer ------------------------------------------------------------------------------
    def sinkhorn_mixer(self, t, prefix: str) -> SinkhornMixer:
        return SinkhornMixer(t(f"{prefix}_fn"), t(f"{prefix}_base"), t(f"{prefix}_scale"), float(self.key(HC_EPS)),
                             self.hp.eps, int(self.key(HC_SINKHORN)))

    def layer(self, spec: LayerSpec, t: BlockTensors) -> Deepseek4Layer:
        return Deepseek4Layer(spec, self.hp.eps, self.count, self.hp.hidden,
                              attn_mixer=self.sinkhorn_mixer(t, "hc_attn"), attn_norm=t(MT.ATTN_NORM),
                              attention=self.compressed_attention(t), ffn_mixer=self.sinkhorn_mixer(t, "hc_ffn"),
                              ffn_norm=t(MT.FFN_NORM), moe=self.moe(t.i, t))

    def compressed_attention(self, t: BlockTensors) -> CompressedAttention:
        ratio = self.compress_ratio(t.i)
        w = {"q_a": t("attn_q_a"), "q_a_norm": t("attn_q_a_norm"), "q_b": t("attn_q_b"), "kv": t("attn_kv"),
             "kv_norm": t("attn_kv_a_norm"), "sinks": t("attn_sinks"), "o_a": t("attn_output_a"),
             "o_b": t("attn_output_b")}
        index = {}
        if ratio:
            w |= {f"comp_{k}": t(f"attn_compressor_{k}") for k in ("kv", "gate", "ape", "norm")}
        if ratio == SPARSE:
            w |= {f"index_{k}": t(f"indexer_compressor_{k}") for k in ("kv", "gate", "ape", "norm")}
            w |= {"index_q_b": t("indexer.attn_q_b"), "index_proj": t("indexer.proj")}
            index = dict(index_heads=int(self.key(Keys.Attention.Indexer.HEAD_COUNT)),
                         index_dim=int(self.key(Keys.Attention.Indexer.KEY_LENGTH)),
                         top_k=int(self.key(Keys.Attention.Indexer.TOP_K)))
        return CompressedAttention(w, self.hp.n_head, self.hp.head_dim, self.hp.eps,
                                   int(self.key(Keys.Attention.SLIDING_WINDOW)), ratio, self.rope_by_kind[ratio > 0],
                                   int(self.key(OUT_GROUPS)), **index)

    def gated_unit(self, i: int, shared: bool = False):
        limit = float(self.layer_key(Keys.LLM.SWIGLU_CLAMP_SHEXP if shared else Keys.LLM.SWIGLU_CLAMP_EXP, i, 0.0))
        if shared and self.gguf.arch_value(Keys.LLM.SWIGLU_CLAMP_SHEXP) is None:   # llama.cpp: the experts' limit
            limit = float(self.layer_key(Keys.LLM.SWIGLU_CLAMP_EXP, i, 0.0))
        return functools.partial(swiglu_clamp, limit=limit) if limit > 1e-6 else None

    def moe(self, i: int, t: BlockTensors) -> MoE:
        shared = MLP(t(MT.FFN_UP_SHEXP), t(MT.FFN_DOWN_SHEXP), t(MT.FFN_GATE_SHEXP), self.activation,
                     glu=self.gated_unit(i, shared=True))
        kw = dict(router=t(MT.FFN_GATE_INP), experts=self.routed_experts(t), act=self.activation,
                  routing=self.routing(i), shared=shared, glu=self.gated_unit(i))
        t("exp_probs_b_vl", "bias", required=False)   # images' selection bias: never a text token's
        if i in self.hash_layers:
            return HashRoutedMoE(t("ffn_gate_tid2eid"), **kw)
        return MoE(selection_bias=t(MT.FFN_EXP_PROBS_B, "bias"), **kw)

    # -- the head ---------------------------------------------------------------------------------
    def load_head(self, device, dtype) -> StreamsHead:
        def held(name):
            return read_tensor(self.gguf, name, device, torch.promote_types(dtype, torch.float32))

        mixer = SinkhornMixer(*(held(f"output_hc_{kind}.weight") for kind in ("fn", "base", "scale")),
                              float(self.key(HC_EPS)), self.hp.eps, 0)
        return StreamsHead(mixer, held("output_norm.weight"), read_tensor(self.gguf, "output.weight", device, dtype),
                           self.hp.eps, self.count)
