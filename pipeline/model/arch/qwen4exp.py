"""qwen4exp (Qwen4-Exp, Qwen3.8-Flash-Next): Qwen3.5-MoE's hybrid of Gated DeltaNet and gated
attention, softmax top-k experts beside a sigmoid-gated shared expert, and imrope, with three
forms of its own, as llama.cpp's graph computes them:

- hyper-connections in place of every norm: the residual is `hyper_connection.count` streams
  (the embedding copied into each), so a boundary after layer 0 holds count x hidden values per
  token. Before each block a mixer RMS-norms every stream with its own (1 + w), gates the normed
  streams by sigmoid(up(silu(down(normed) / count))) and feeds their mean to the block; the
  block's output is added back into stream c scaled by 2 sigmoid(inject_c(normed) / count). A
  mixer without the write back replaces the output norm;
- Gated DeltaNet whose output gate is a sigmoid, not a SiLU;
- query-sparse attention on the attention layers with a compress ratio r: an indexer scores
  each complete block of r keys, sum over its heads of relu(q_h . k_b), k_b the mean of the
  block's raw indexer keys, RMS-normed and rotated at the block's first position; a query keeps
  the keys of its incomplete tail block, and of the best blocks the `indexer.top_k` + r - 1 -
  (tail) keys of highest score, ggml's top-k breaking the ties: the slots left by the tail go to
  keys of the next-best block (where transformers keeps whole blocks only);
- an n-gram hash embedding into one recurrent layer: per token, for n = 2 .. ngram_size, the XOR
  of the last n tokens' ids times the file's multipliers (an EOS, or the sequence's start,
  cuts the n-gram: EOS stands in for what lies before), modulo each head's prime table size,
  picks a row of per_layer_token_embd per head; their concatenation gives a value and one key
  per stream, each stream's normed dot product with its key gates the value (sigmoid of its
  signed square root), and the gated value plus a SiLU'd depthwise causal convolution dilated
  by ngram_size of its norm join the streams.
"""
import functools
import math

import numpy as np
import torch
import torch.nn.functional as F
from gguf import MODEL_TENSOR as MT
from gguf import Keys
from torch import nn

from ...errors import UserError
from ...gguf_io.dequant import dequantize
from ..llama_cpp_numerics import plain_values
from .blocks import Attention, AttentionSpec, Weights, rms_norm
from .family import COMPRESS_RATIOS, FLOAT32_TENSORS, HyperConnections, LayerSpec
from .loading import BlockTensors, read_tensor
from .modules import StreamsHead, StreamsLayer
from .qwen3next import Qwen35
from .rope import apply_rope
from .shapes import expect
from .ssm import SSM_FLOAT32_TENSORS

HC_LOW_RANK = "{arch}.hyper_connection.low_rank"
PLE_LAYERS = "{arch}.ple.layers"
PLE_NGRAM = "{arch}.ple.ngram_size"
PLE_HEADS_PER_NGRAM = "{arch}.ple.heads_per_ngram"
PLE_CONV_KERNEL = "{arch}.ple.conv_kernel"
PLE_EOS = "{arch}.ple.eos_token_id"
PLE_MULTIPLIERS = "{arch}.ple.layer_multipliers"
PLE_OFFSETS = "{arch}.ple.head_offsets"
PLE_VOCABS = "{arch}.ple.head_vocab_sizes"
PLE_TABLE = "per_layer_token_embd.weight"
INDEXER = ("indexer.q_proj", "indexer.k_proj", "indexer.q_norm", "indexer.k_norm")   # an attention layer's


class HyperMixer(Weights):
    """One hyper-connection mixer: streams [..., count, hidden] -> (the block's input [...,
    hidden], each stream's write-back weight [..., count], or None without `inject`)."""

    def __init__(self, norm, down, up, inject, eps: float):
        super().__init__({"norm": norm, "down": down, "up": up, "inject": inject})
        self.eps = eps

    def forward(self, streams: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        n = streams.shape[-2]
        normed = rms_norm(streams, self.norm, self.eps)                                # [..., n, H]
        flat = normed.flatten(-2)                                                       # [..., n H]
        gate = F.linear(F.silu(F.linear(flat, self.down) * (1.0 / n)), self.up)      # [..., n H]
        mixed = (normed * torch.sigmoid(gate).view_as(normed)).mean(dim=-2)           # [..., H]
        if self.inject is None:
            return mixed, None
        return mixed, 2 * torch.sigmoid(F.linear(flat, self.inject) * (1.0 / n))     # [..., n]


def write_back(streams: torch.Tensor, out: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """streams [B, T, count, hidden] + the block's output [B, T, hidden] scaled per stream by
    weights [B, T, count]."""
    return streams + out[:, :, None] * weights[..., None]


class NGramInjection(Weights):
    """The n-gram embedding's contribution to the streams: (streams [B, T, count, hidden], the
    tokens' n-gram rows [B, T, width]) -> streams [B, T, count, hidden]."""

    def __init__(self, w: dict[str, torch.Tensor], eps: float, dilation: int):
        super().__init__(w)
        self.eps, self.dilation = eps, dilation

    def describe(self) -> str:
        return f"conv kernel={self.conv.shape[1]}, dilation={self.dilation}"

    def forward(self, streams: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        B, T, n, H = streams.shape
        key = rms_norm(F.linear(rows, self.key).view(B, T, n, H), self.norm_key, self.eps)
        query = rms_norm(streams, self.norm_query, self.eps)
        s = (key * query).sum(-1, keepdim=True) * (1.0 / math.sqrt(H))                 # [B, T, n, 1]
        gated = F.linear(rows, self.value)[:, :, None] * torch.sigmoid(s.sign() * s.abs().clamp_min(1e-6).sqrt())
        normed = rms_norm(gated, self.norm_conv, self.eps).reshape(B, T, n * H)       # [B, T, n H]
        K = self.conv.shape[1]
        padded = F.pad(normed.transpose(1, 2), ((K - 1) * self.dilation, 0))          # [B, n H, T + pad]
        conv = F.conv1d(padded, self.conv.unsqueeze(1), groups=n * H, dilation=self.dilation)
        return streams + gated + F.silu(conv.transpose(1, 2)).view(B, T, n, H)


class NGramRows(nn.Module):
    """The n-gram hash embedding's rows, from the token ids alone: ids [B, T] -> {its layer:
    [B, T, heads x row width]}; only the rows that occur are read and dequantized."""

    def __init__(self, arch: "Qwen4Exp", device, dtype):
        super().__init__()
        self.arch, self.device, self.dtype = arch, device, dtype

    def forward(self, ids: torch.Tensor) -> dict[int, torch.Tensor]:
        arch = self.arch
        index = ngram_rows(ids.numpy(), *arch.ngram_hash)                              # [B, T, heads]
        unique, inverse = np.unique(index, return_inverse=True)
        info = arch.gguf.tensors[PLE_TABLE]
        table = dequantize(arch.gguf.raw(PLE_TABLE)[unique], info.qtype, self.device, PLE_TABLE, self.dtype)
        rows = table[torch.from_numpy(inverse.reshape(index.shape)).to(self.device)]  # [B, T, heads, width]
        return {arch.ple_layer: rows.flatten(2)}


def ngram_rows(ids: np.ndarray, multipliers: np.ndarray, offsets: np.ndarray, sizes: np.ndarray,
               per_ngram: int, eos: int) -> np.ndarray:
    """ids [B, T] -> the table row of each n-gram head [B, T, heads], as llama.cpp hashes them
    (in uint64 arithmetic, wrapping): heads (n - 2) x per_ngram .. of n = 2 .. len(multipliers)."""
    B, T = ids.shape
    n = len(multipliers)
    tokens = ids.astype(np.uint64)
    context, cut = [tokens], np.zeros((B, T), dtype=bool)
    for s in range(1, n):   # the token s back; EOS once an EOS or the sequence's start lies between
        back = np.full((B, T), eos, dtype=np.uint64)
        back[:, s:] = tokens[:, :T - s]
        cut |= back == eos
        cut[:, :s] = True
        context.append(np.where(cut, np.uint64(eos), back))
    heads = []
    mixed = context[0] * multipliers[0]
    for k in range(1, n):
        mixed = mixed ^ (context[k] * multipliers[k])
        h = slice((k - 1) * per_ngram, k * per_ngram)
        heads.append(mixed[..., None] % sizes[h] + offsets[h])
    return np.concatenate(heads, axis=-1).astype(np.int64)


class QuerySparseAttention(Attention):
    """Gated attention over the keys its indexer keeps: x [B, T, hidden] -> [B, T, hidden]."""

    def __init__(self, w, spec: AttentionSpec, eps: float, n_index_head: int, index_dim: int, ratio: int,
                 budget: int):
        super().__init__(w, spec, eps)
        self.n_index_head, self.index_dim, self.ratio, self.budget = n_index_head, index_dim, ratio, budget

    def describe(self) -> str:
        return (f"indexer heads={self.n_index_head} x {self.index_dim}, blocks of {self.ratio}, "
                f"budget {self.budget}, " + super().describe())

    def attend_from(self, x: torch.Tensor, q, k, v, tables) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.select(x, tables)[:, None],
                                              scale=self.spec.scale, enable_gqa=self.spec.n_kv != self.spec.n_head)

    def select(self, x: torch.Tensor, tables) -> torch.Tensor:
        """The keys each query attends to, [B, T queries, T keys] bool (in float32 whatever the
        compute dtype: 16 bits would move the choice)."""
        B, T, _ = x.shape
        w, H, D, r, rope = self.w, self.n_index_head, self.index_dim, self.ratio, self.spec.rope
        x = x.float()
        cos, sin = tables.rope(rope, torch.float32)                                    # [T, dim / 2]
        q = rms_norm(F.linear(x, w["index_q"]).view(B, T, H, D), w["index_q_norm"], self.eps).transpose(1, 2)
        q = apply_rope(q, cos, sin, rope)                                               # [B, H, T, D]
        n_blocks = T // r
        keys = F.linear(x[:, :n_blocks * r], w["index_k"]).view(B, n_blocks, r, D)
        pooled = rms_norm(keys.sum(2) * (1.0 / r), w["index_k_norm"], self.eps)        # [B, blocks, D]
        pooled = apply_rope(pooled[:, None], cos[::r][:n_blocks], sin[::r][:n_blocks], rope)  # at each block's start
        scores = torch.relu(q @ pooled.transpose(-1, -2)).sum(1)                        # [B, T, blocks]
        selected = np.zeros((B, T, T), dtype=np.bool_)
        from .heap_select import select_keys

        select_keys(scores.cpu().numpy(), r, self.budget + r - 1, selected)
        return torch.from_numpy(selected).to(x.device)


class Qwen4ExpLayer(StreamsLayer):
    """llama.cpp's qwen4exp graph, one layer: forward(x [B, T, width in], tables, state, the
    n-gram rows [B, T, width] or None) -> [B, T, count x hidden]."""

    def forward(self, x: torch.Tensor, tables, state=None, token_input: torch.Tensor | None = None) -> torch.Tensor:
        B, T, _ = x.shape
        h = self.streams(x)                                                              # [B, T, count, hidden]
        if self.ngram is not None:
            h = self.ngram(h, token_input)
        a, weights = self.attn_mixer(h)
        h = write_back(h, self.mixer(a, tables, state), weights)
        f, weights = self.ffn_mixer(h)
        h = write_back(h, self.ffn(f), weights)
        return h.reshape(B, T, -1)


class Qwen4Exp(HyperConnections, Qwen35):
    packs_sequences = False    # its indexer pools keys by their place in the row
    delta_net_gate = staticmethod(torch.sigmoid)   # diff: Qwen3.5's output gate is a SiLU
    float32_tensors = FLOAT32_TENSORS + SSM_FLOAT32_TENSORS + (
        "ple_norm_key.weight", "ple_norm_query.weight", "ple_norm_conv.weight",
        "indexer.q_proj.weight", "indexer.k_proj.weight")
    honours = Qwen35.honours | {Keys.Attention.Indexer.HEAD_COUNT, Keys.Attention.Indexer.KEY_LENGTH,
                                Keys.Attention.Indexer.TOP_K}

    def __init__(self, gguf):
        super().__init__(gguf)
        layers = self.gguf.arch_value(PLE_LAYERS)
        layers = [] if layers is None else [int(i) for i in np.atleast_1d(layers)]
        if len(layers) > 1 or any(not 0 <= i < self.hp.n_layers or not self.is_recurrent(i) for i in layers):
            raise UserError(f"{gguf.path}: n-gram embedding layers {layers}: llama.cpp computes one, on a "
                            f"Gated DeltaNet layer")
        self.ple_layer = layers[0] if layers else None
        self.takes_token_ids = self.ple_layer is not None
        self.check_own_shapes()

    def check_own_shapes(self) -> None:
        """The mixers', the n-gram embedding's and the indexers' tensors against the metadata."""
        n, H, rank = self.count, self.hp.hidden, int(self.key(HC_LOW_RANK))
        why = "hyper_connection.count x embedding_length, low_rank"
        mixers = [("output_hc", False)] + [(f"blk.{i}.{kind}", True) for i in range(self.hp.n_layers)
                                           for kind in ("hc_attn", "hc_ffn")]
        for prefix, inject in mixers:
            for kind, shape in (("norm", (n * H,)), ("down", (rank, n * H)), ("up", (n * H, rank)),
                                ("inject", (n, n * H))):
                if kind != "inject" or inject:
                    expect(self, f"{prefix}_{kind}.weight", shape, why, required=True)
        if self.ple_layer is not None:
            self.ngram_hash   # its constants against the table, before any work
            rows, width = self.gguf.tensors[PLE_TABLE].shape
            heads = (int(self.key(PLE_NGRAM)) - 1) * int(self.key(PLE_HEADS_PER_NGRAM))
            if heads * width != H:
                raise UserError(f"{self.gguf.path}: {heads} n-gram heads of {width} values make no embedding "
                                f"of {H}")
            kernel = int(self.key(PLE_CONV_KERNEL))
            for kind, shape in (("key", (n * H, H)), ("value", (H, H)), ("norm_key", (n * H,)),
                                ("norm_query", (n * H,)), ("norm_conv", (n * H,)), ("conv1d", (n * H, kernel))):
                expect(self, f"blk.{self.ple_layer}.ple_{kind}.weight", shape, why + ", ple.conv_kernel",
                       required=True)
        heads, size = (int(self.key(k, 0)) for k in (Keys.Attention.Indexer.HEAD_COUNT,
                                                       Keys.Attention.Indexer.KEY_LENGTH))
        for i in filter(lambda i: self.compress_ratio(i) > 0 and not self.is_recurrent(i), range(self.hp.n_layers)):
            for kind, shape in (("q_proj", (heads * size, H)), ("k_proj", (size, H)), ("q_norm", (size,)),
                                ("k_norm", (size,))):
                expect(self, f"blk.{i}.indexer.{kind}.weight", shape, "indexer heads and key_length", required=True)

    @functools.cached_property
    def ngram_hash(self) -> tuple:
        """(multipliers, head offsets, head table sizes, heads per n-gram, EOS) of the n-gram hash."""
        n, per_ngram = int(self.key(PLE_NGRAM)), int(self.key(PLE_HEADS_PER_NGRAM))
        multipliers, offsets, sizes = (np.asarray(self.key(k), dtype=np.uint64)
                                       for k in (PLE_MULTIPLIERS, PLE_OFFSETS, PLE_VOCABS))
        heads = (n - 1) * per_ngram
        rows = self.gguf.tensors[PLE_TABLE].shape[0]
        if n < 2 or len(multipliers) < n or len(offsets) < heads or len(sizes) < heads or (
                (offsets[:heads] + sizes[:heads]).max() > rows or sizes[:heads].min() == 0):
            raise UserError(f"{self.gguf.path}: the n-gram hash's {len(multipliers)} multipliers and "
                            f"{len(sizes)} head tables do not fit n-grams of {n} with {per_ngram} heads each "
                            f"into {rows} rows")
        return multipliers[:n], offsets[:heads], sizes[:heads], per_ngram, int(self.key(PLE_EOS))

    def compress_ratio(self, i: int) -> int:
        return int(self.layer_key(COMPRESS_RATIOS, i, 0))

    def activation_floats(self, i: int) -> int:
        """Qwen3.5's, and what its mixers hold beside the streams: each stream normed, its gate and
        the gated streams, three values of every stream a token (measured at hidden 2048)."""
        return super().activation_floats(i) + 3 * self.count * self.hp.hidden

    # -- what a boundary carries ---------------------------------------------------------------
    def token_inputs(self, first: int, last: int, device, dtype) -> NGramRows | None:
        return NGramRows(self, device, dtype) if self.ple_layer is not None and first <= self.ple_layer < last else None

    def attention_score_bytes(self, batch: int, ctx: int, n_head: int, device: str) -> int:
        """Qwen3.5's, each query's selection of keys, [batch, ctx, ctx] bool, built on the host, and
        the indexer's float32 scores of the blocks, [batch, indexer heads + 1, ctx, blocks]."""
        ratios = [r for r in map(self.compress_ratio, range(self.hp.n_layers)) if r > 0]
        if not ratios:
            return super().attention_score_bytes(batch, ctx, n_head, device)
        heads = int(self.key(Keys.Attention.Indexer.HEAD_COUNT))
        return (super().attention_score_bytes(batch, ctx, n_head, device) + batch * ctx * ctx
                + 4 * batch * (heads + 1) * ctx * (ctx // min(ratios)))

    # -- the layer ------------------------------------------------------------------------------
    def hyper_mixer(self, t, prefix: str, inject: bool = True) -> HyperMixer:
        n, H = self.count, self.hp.hidden
        return HyperMixer(t(f"{prefix}_norm").view(n, H), t(f"{prefix}_down"), t(f"{prefix}_up"),
                          t(f"{prefix}_inject") if inject else None, self.hp.eps)

    def layer(self, spec: LayerSpec, t: BlockTensors) -> Qwen4ExpLayer:
        ngram = None
        if spec.index == self.ple_layer:
            n, H = self.count, self.hp.hidden
            w = {"key": t("ple_key"), "value": t("ple_value"), "conv": plain_values(t("ple_conv1d")),
                 **{f"norm_{k}": t(f"ple_norm_{k}").view(n, H) for k in ("key", "query", "conv")}}
            ngram = NGramInjection(w, self.hp.eps, int(self.key(PLE_NGRAM)))
        return Qwen4ExpLayer(spec, self.hp.eps, self.count, self.hp.hidden, ngram=ngram,
                             attn_mixer=self.hyper_mixer(t, "hc_attn"), mixer=self.mixer(spec, t),
                             ffn_mixer=self.hyper_mixer(t, "hc_ffn"), ffn=self.ffn(spec, t))

    def attention(self, spec: AttentionSpec, t: BlockTensors) -> Attention:
        ratio = self.compress_ratio(t.i)
        if ratio <= 0:   # dense, as llama.cpp computes it: the indexer a converter may have written goes unused
            t.unused(*INDEXER)
            return super().attention(spec, t)
        w = self.attention_weights(spec, t) | {
            "index_q": t("indexer.q_proj"), "index_k": t("indexer.k_proj"), "index_q_norm": t("indexer.q_norm"),
            "index_k_norm": t(MT.INDEXER_K_NORM)}
        return QuerySparseAttention(w, spec, self.hp.eps, int(self.key(Keys.Attention.Indexer.HEAD_COUNT)),
                                    int(self.key(Keys.Attention.Indexer.KEY_LENGTH)), ratio,
                                    int(self.key(Keys.Attention.Indexer.TOP_K)))

    # -- the head ---------------------------------------------------------------------------------
    def output_norm_shape(self) -> tuple[str, tuple[int, ...], str]:
        return "output_hc_norm.weight", (self.count * self.hp.hidden,), "hyper_connection.count x embedding_length"

    def load_head(self, device, dtype) -> StreamsHead:
        n, H = self.count, self.hp.hidden

        def wide(name):   # the head computes in float32
            return read_tensor(self.gguf, name, device, torch.promote_types(dtype, torch.float32))

        out = "output.weight" if "output.weight" in self.gguf.tensors else "token_embd.weight"
        mixer = HyperMixer(wide("output_hc_norm.weight").view(n, H), wide("output_hc_down.weight"),
                           wide("output_hc_up.weight"), None, self.hp.eps)
        return StreamsHead(mixer, None, read_tensor(self.gguf, out, device, dtype), self.hp.eps, n)   # no output norm
