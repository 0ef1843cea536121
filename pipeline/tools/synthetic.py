"""Random-weight GGUFs of any shape, written with gguf-py, for benchmarks and checks that need a
model bigger than the machine's memory (a 7B llama, a Qwen3-30B-A3B- or Nemotron-H-30B-A3B-shaped
mixture of experts) or one of a family's risky paths on a host with no converter at hand.

Families: `llama` (dense), `qwen3moe` (QK-norm attention, softmax-routed SwiGLU experts),
`nemotron_h_moe` (a layer pattern of Mamba2 mixers `M`, attention `*` without position encoding,
sigmoid-routed squared-ReLU experts `E` with a selection bias and a shared expert; as llama.cpp
reads this family, every feed-forward layer is one of experts) and `deepseek2` (multi-head latent
attention, leading dense layers, then sigmoid-routed experts in groups with a selection bias and
a shared expert, YaRN as DeepSeek-V3 sets it), `deepseek32` (deepseek2's with DeepSeek Sparse
Attention: a lightning indexer picks each query's `index_top_k` keys), `kimi-linear` (Kimi Delta
Attention layers, latent attention without RoPE every `attention_every`-th layer, leading dense
layers, then deepseek2's experts without groups), `gemma4` (Gemma 4 E2B-like: sliding layers with
a global one every `attention_every`-th, proportional RoPE and their own head size on the global
ones, the last `shared_kv_layers` layers over the K/V of earlier ones, per-layer embeddings,
post-norms, output scales and the final soft-cap), `minimax-m3` (MiniMax Sparse Attention past the
leading dense layers: an indexer head per KV group picks each query's `index_top_k` blocks of
`index_block` keys; clamped SwiGLU everywhere; sigmoid-routed experts beside a shared expert),
`gpt-oss` (attention sinks, a sliding window on
every other layer, biases on attention, router and experts, clamped SwiGLU experts), `llama4`
(no RoPE and the attention temperature every fourth layer, chunked attention on the others,
weightless QK-norm, a top-1 sigmoid-routed MoE with a shared expert every `moe_every`-th layer)
`qwen3next` (Gated DeltaNet layers, gated full attention every `attention_every`-th layer with
partial RoPE, softmax-routed experts beside a sigmoid-gated shared expert), `qwen4exp` (qwen3next's
layers under `streams` hyper-connections of rank `streams_rank`, the attention query-sparse: an
indexer of `index_heads` heads keeps `index_top_k` keys in blocks of `index_block`; the n-gram hash
embedding of n-grams up to `ngram`, `ngram_heads` heads each, on layer 0) and `deepseek4` (DeepSeek-V4:
`streams` hyper-connections mixed by Sinkhorn, one shared key/value head of `head_dim` with its last
`rope_dim` values rotated, attention sinks over a `sliding_window`, per layer (`pattern`) nothing
more (`S`), compressed entries of 4 keys picked by an indexer (`C`: `index_heads` of `index_dim`,
`index_top_k` kept) or all compressed entries of 128 keys (`H`), a grouped low-rank output
(`out_groups` of rank `out_rank`), experts routed by sqrt-softplus, the first `hash_layers` by the
token's id, SwiGLU clamped at `swiglu_limit`). `F32` matrices give files that llama-perplexity
computes without rounding.
The tokenizer is copied from a real GGUF so a pass reads ordinary text. Quantized weights are
random blocks made from random bytes and fixed scales (nothing is quantized from float data,
so 16 GB are written in minutes), each matrix's values of mean 0 and standard deviation
1/sqrt(fan-in), which keeps the hidden state bounded; the LM head is `head_gain` times that, so
predictions are far from uniform. Tensors are streamed to disk one at a time.

    python -m pipeline.tools.synthetic --config configs/synthetic.toml NAME

writes the settings file's [synthetic.NAME] model into data/models/NAME.gguf (where it is not
there yet) and prints its path, for `luigi --module pipeline PerplexityRun --model PATH`.
"""
import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, ExpertGatingFuncType, GGUFValueType, GGUFWriter, Keys, RopeScalingType
from gguf import GGMLQuantizationType as Q

from ..errors import UserError
from ..gguf_io.reader import GGUFIndex
from ..model.arch.audit import GATING_CODES


@dataclass(frozen=True)
class Shape:
    family: str = "llama"      # llama, qwen3moe, nemotron_h_moe
    layers: int = 32
    hidden: int = 4096
    ffn: int = 11008           # dense feed-forward width (llama)
    heads: int = 32
    kv_heads: int = 32
    head_dim: int = 0          # 0: hidden / heads
    context: int = 4096
    quant: str = "Q4_0"        # Q4_0 or Q4_K for the matrices
    experts: int = 0
    experts_used: int = 0
    expert_ffn: int = 0
    shared_ffn: int = 0        # nemotron_h_moe's shared expert
    pattern: str = ""          # nemotron_h_moe: one of M, E, * per layer
    ssm_heads: int = 0         # nemotron_h_moe's Mamba2 mixers
    ssm_head_dim: int = 64
    ssm_state: int = 128
    ssm_groups: int = 8
    conv_kernel: int = 4
    q_lora_rank: int = 0       # deepseek2's latent attention: query and KV ranks,
    kv_lora_rank: int = 0
    rope_dim: int = 0          # the decoupled RoPE part of head_dim,
    value_dim: int = 0         # the value head size,
    dense_layers: int = 0      # the leading dense layers,
    expert_groups: int = 0     # and the routing groups (0: none)
    groups_used: int = 0
    sliding_window: int = 0    # gpt-oss: the span of its sliding layers; llama4: 0 turns chunks off
    moe_every: int = 1         # llama4: every n-th layer a MoE, the others a dense MLP
    attention_every: int = 4   # qwen3next, kimi-linear: every n-th layer attends, the others are DeltaNet or KDA
    index_heads: int = 0       # deepseek32's indexer: heads, their size and the keys each query keeps
    index_dim: int = 0
    index_top_k: int = 0
    index_block: int = 0       # minimax-m3: the keys of a block its indexer scores by their best
    global_head_dim: int = 0   # gemma4: the global layers' head size,
    shared_kv_layers: int = 0  # the last layers that attend over earlier layers' K/V,
    per_layer_dim: int = 0     # and the per-layer embeddings' width
    streams: int = 0           # qwen4exp: hyper-connections' residual streams and their mixers' rank,
    streams_rank: int = 0
    ngram: int = 0             # and its n-gram hash embedding: n-grams up to this size, heads of each
    ngram_heads: int = 0
    out_groups: int = 0        # deepseek4: the output projection's groups and their rank,
    out_rank: int = 0
    hash_layers: int = 0       # the leading layers routed by the token's id,
    swiglu_limit: float = 0.0  # and the SwiGLU clamp of every feed-forward block
    head_gain: float = 2.5     # LM-head weights' scale over 1/sqrt(hidden)

    @property
    def key_dim(self) -> int:
        return self.head_dim or self.hidden // self.heads

    def kind(self, i: int) -> str:
        """Layer i's op: `M`, `E` or `*` (nemotron_h_moe); `S`, `C` or `H` (deepseek4's attention); `D`,
        a DeltaNet (qwen3next, qwen4exp) or KDA (kimi-linear) layer and a feed-forward block; elsewhere
        attention and a feed-forward block (`A`)."""
        if self.family in ("nemotron_h_moe", "deepseek4"):
            return self.pattern[i]
        if self.family in ("qwen3next", "qwen4exp", "kimi-linear") and (i + 1) % self.attention_every:
            return "D"
        return "A"

    def is_sliding(self, i: int) -> bool:
        """gemma4: layer i attends over a window (every `attention_every`-th layer globally)."""
        return (i + 1) % self.attention_every != 0

    def has_experts(self, i: int) -> bool:
        """Whether layer i's feed-forward block (`A` or `D`) is a mixture of experts."""
        if self.family == "llama4":
            return (i + 1) % self.moe_every == 0
        return self.family in GATED_EXPERTS and i >= self.dense_layers


FAMILIES = ("llama", "qwen3moe", "nemotron_h_moe", "deepseek2", "deepseek32", "kimi-linear", "gemma4", "minimax-m3",
            "gpt-oss", "llama4", "qwen3next", "qwen4exp", "deepseek4")
LATENT = ("deepseek2", "deepseek32", "kimi-linear")    # multi-head latent attention
QWEN_HYBRID = ("qwen3next", "qwen4exp")                # Gated DeltaNet and gated attention
# SwiGLU experts (nemotron_h_moe's have no gate), the families with a shared expert, with a selection bias
GATED_EXPERTS = ("qwen3moe", "gpt-oss", "llama4", "minimax-m3", "deepseek4", *QWEN_HYBRID, *LATENT)
SHARED_EXPERT = ("nemotron_h_moe", "llama4", "minimax-m3", "deepseek4", *QWEN_HYBRID, *LATENT)
SELECTION_BIAS = ("nemotron_h_moe", "minimax-m3", *LATENT)
SIGMOID_ROUTED = ("minimax-m3", *LATENT)   # past leading dense layers, with a shared expert


def check_shape(shape: Shape) -> None:
    if shape.family not in FAMILIES:
        raise UserError(f"synthetic family {shape.family!r} is not one of {', '.join(FAMILIES)}")
    if shape.quant not in ("Q4_0", "Q4_K", "BF16", "F32"):
        raise UserError(f"synthetic quant {shape.quant!r}: Q4_0, Q4_K, BF16 or F32")
    kinds = {"nemotron_h_moe": "ME*", "deepseek4": "SCH"}.get(shape.family)
    if kinds and (len(shape.pattern) != shape.layers or set(shape.pattern) - set(kinds)):
        raise UserError(f"synthetic {shape.family}: pattern {shape.pattern!r} needs one of {', '.join(kinds)} "
                        f"per layer")
    block = GGML_QUANT_SIZES[Q.Q4_0][0]
    for name, dims, qtype, _ in _Tensors(shape, vocab=block).build():
        if qtype not in (Q.F32, Q.I32) and dims[-1] % block:
            raise UserError(f"synthetic model: {name} has rows of {dims[-1]} values, no multiple of {block}")


def _blocks(rng: np.random.Generator, qtype: Q, n_values: int, fan_in: int, gain: float) -> np.ndarray:
    """Random blocks of `qtype` for n_values values of mean 0, std gain/sqrt(fan_in): uint8 [n_blocks, type_size].
    BF16: normal values (the base a quantization sweep makes its files from); Q4_0, Q4_K: uniform nibbles."""
    if qtype == Q.BF16:
        values = rng.standard_normal(n_values, dtype=np.float32) * np.float32(gain / np.sqrt(fan_in))
        bits = values.view(np.uint32)
        bits += 0x7FFF + ((bits >> 16) & 1)                               # round to nearest even
        return (bits >> 16).astype(np.uint16).view(np.uint8).reshape(-1, 2)
    block, size = GGML_QUANT_SIZES[qtype]
    raw = np.frombuffer(rng.bytes(n_values // block * size), dtype=np.uint8).reshape(-1, size).copy()
    step = gain / (np.sqrt((16 ** 2 - 1) / 12) * np.sqrt(fan_in))      # a uniform nibble's std is 4.61
    if qtype == Q.Q4_0:       # d * (q - 8), of mean -d/2: d's sign drawn per block makes it 0
        d = np.where(rng.random(raw.shape[0]) < 0.5, -step, step).astype(np.float16)
        raw[:, :2] = d.view(np.uint8).reshape(-1, 2)
    else:                     # Q4_K: d * scale * q - dmin * min, every scale and min 1, dmin = 7.5 d
        header = np.float16([step, 7.5 * step]).tobytes() + bytes([1] * 8 + [0x11] * 4)
        raw[:, :16] = np.frombuffer(header, dtype=np.uint8)
    return raw


class _Tensors:
    """The file's tensors in order: (name, dims as torch lists them, GGML type, how to make its data)."""

    def __init__(self, shape: Shape, vocab: int):
        self.s, self.vocab, self.list = shape, vocab, []

    def matrix(self, name: str, *dims: int, gain: float = 1.0) -> None:
        if self.s.quant == "F32":
            return self.vector(name, *dims, fill=("normal", gain / np.sqrt(dims[-1])))
        # rows that are no multiple of a K-quant's 256 values fall back on Q4_0, as llama.cpp's quantizer does
        qtype = Q[self.s.quant] if dims[-1] % GGML_QUANT_SIZES[Q[self.s.quant]][0] == 0 else Q.Q4_0
        self.list.append((name, dims, qtype, ("random", dims[-1], gain)))

    def vector(self, name: str, *dims: int, fill=("ones",)) -> None:
        self.list.append((name, dims, Q.F32, fill))

    def build(self) -> list:
        s, h = self.s, self.s.hidden
        self.matrix("token_embd.weight", self.vocab, h, gain=np.sqrt(h))   # embeddings of std 1
        if s.family == "qwen4exp":   # the final mixer in place of the output norm
            self.hyper_mixer("output_hc", inject=False)
        elif s.family == "deepseek4":
            self.sinkhorn_mixer("output_hc", s.streams)
            self.vector("output_norm.weight", h)
        else:
            self.vector("output_norm.weight", h)
        self.matrix("output.weight", self.vocab, h, gain=s.head_gain)
        if s.family == "gemma4":
            return self.gemma4()
        if s.family == "deepseek4":
            return self.deepseek4()
        if s.family == "qwen4exp" and s.ngram:
            self.ngram_table()
        for i in range(s.layers):
            p, kind = f"blk.{i}.", s.kind(i)
            if s.family == "qwen4exp":
                self.hyper_mixer(p + "hc_attn")
                self.hyper_mixer(p + "hc_ffn")
                if i == 0 and s.ngram:
                    self.ngram_injection(p)
            else:
                self.vector(p + "attn_norm.weight", h)
            if kind in "A*":
                self.latent_attention(p) if s.family in LATENT else self.attention(p)
                if s.family in ("minimax-m3", "qwen4exp") and i >= s.dense_layers:
                    self.msa_indexer(p)
            if kind == "D":
                self.kda(p) if s.family == "kimi-linear" else self.delta_net(p)
            if kind in "AD":
                # gpt-oss and qwen3next store the FFN's pre-norm as the post-attention norm
                if s.family != "qwen4exp":
                    post = s.family in ("gpt-oss", "qwen3next")
                    self.vector(p + ("post_attention_norm.weight" if post else "ffn_norm.weight"), h)
                self.experts(p) if s.has_experts(i) else self.mlp(p)
            elif kind == "E":
                self.experts(p)
            elif kind == "M":
                self.mamba2(p)
        return self.list

    def attention(self, p: str) -> None:
        s, h = self.s, self.s.hidden
        gated = 2 if s.family in QWEN_HYBRID else 1            # Q's rows carry the output gate
        self.matrix(p + "attn_q.weight", gated * s.heads * s.key_dim, h)
        self.matrix(p + "attn_k.weight", s.kv_heads * s.key_dim, h)
        self.matrix(p + "attn_v.weight", s.kv_heads * s.key_dim, h)
        self.matrix(p + "attn_output.weight", h, s.heads * s.key_dim)
        if s.family in ("qwen3moe", "minimax-m3", *QWEN_HYBRID):
            self.vector(p + "attn_q_norm.weight", s.key_dim)
            self.vector(p + "attn_k_norm.weight", s.key_dim)
        if s.family == "gpt-oss":
            for name, rows in (("q", s.heads * s.key_dim), ("k", s.kv_heads * s.key_dim),
                               ("v", s.kv_heads * s.key_dim), ("output", h)):
                self.vector(p + f"attn_{name}.bias", rows, fill=("normal", 0.02))
            self.vector(p + "attn_sinks.weight", s.heads, fill=("normal", 1.0))

    def delta_net(self, p: str) -> None:
        """A Gated DeltaNet mixer: ssm_groups key heads of ssm_state, ssm_heads value heads of ssm_head_dim."""
        s, h = self.s, self.s.hidden
        keys, values = s.ssm_groups * s.ssm_state, s.ssm_heads * s.ssm_head_dim
        self.matrix(p + "attn_qkv.weight", 2 * keys + values, h)
        self.matrix(p + "attn_gate.weight", values, h)
        if s.family == "qwen4exp":   # beta's and alpha's projections apart, as its converter writes them
            self.vector(p + "ssm_beta.weight", s.ssm_heads, h, fill=("normal", 1 / np.sqrt(h)))
            self.vector(p + "ssm_alpha.weight", s.ssm_heads, h, fill=("normal", 1 / np.sqrt(h)))
        else:
            self.vector(p + "ssm_ba.weight", 2 * s.ssm_heads, h, fill=("normal", 1 / np.sqrt(h)))
        self.vector(p + "ssm_conv1d.weight", 2 * keys + values, s.conv_kernel,
                    fill=("normal", 1 / np.sqrt(s.conv_kernel)))
        self.vector(p + "ssm_dt.bias", s.ssm_heads, fill=("dt_bias",))
        self.vector(p + "ssm_a", s.ssm_heads, fill=("ssm_a",))
        self.vector(p + "ssm_norm.weight", s.ssm_head_dim)
        self.matrix(p + "ssm_out.weight", h, values)

    def gemma4(self) -> list:
        """Gemma 4's per-layer embeddings and RoPE factors, then each layer: attention over its own K/V
        (the last shared_kv_layers have none), its post-norms, the MLP, the per-layer input's gate and
        projection, the output scale."""
        s, h, ple = self.s, self.s.hidden, self.s.per_layer_dim
        self.matrix("per_layer_token_embd.weight", self.vocab, s.layers * ple, gain=np.sqrt(ple))
        self.matrix("per_layer_model_proj.weight", s.layers * ple, h)
        self.vector("per_layer_proj_norm.weight", ple)
        self.vector("rope_freqs.weight", s.global_head_dim // 2, fill=("proportional", s.global_head_dim // 4))
        for i in range(s.layers):
            p, d = f"blk.{i}.", s.key_dim if s.is_sliding(i) else s.global_head_dim
            self.matrix(p + "attn_q.weight", s.heads * d, h)
            self.vector(p + "attn_q_norm.weight", d)
            if i < s.layers - s.shared_kv_layers:
                self.matrix(p + "attn_k.weight", s.kv_heads * d, h)
                self.matrix(p + "attn_v.weight", s.kv_heads * d, h)
                self.vector(p + "attn_k_norm.weight", d)
            self.matrix(p + "attn_output.weight", h, s.heads * d)
            for name in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm", "post_norm"):
                self.vector(p + f"{name}.weight", h)
            self.mlp(p)
            self.matrix(p + "inp_gate.weight", ple, h)
            self.matrix(p + "proj.weight", h, ple)
            self.vector(p + "layer_output_scale.weight", 1)
        return self.list

    def deepseek4(self) -> list:
        """DeepSeek-V4's layers: each block behind a Sinkhorn mixer of the streams and a norm; the
        attention's query latent, one key/value head, sinks, the compressors and the indexer of
        its kind, the grouped output; experts (a token-id table on the hash layers, else a
        selection bias) beside a shared expert."""
        s, h, d = self.s, self.s.hidden, self.s.key_dim
        for i in range(s.layers):
            p, kind = f"blk.{i}.", s.kind(i)
            for block in ("attn", "ffn"):
                self.sinkhorn_mixer(p + f"hc_{block}", (2 + s.streams) * s.streams)
            self.vector(p + "attn_norm.weight", h)
            self.vector(p + "attn_sinks.weight", s.heads, fill=("normal", 1.0))
            self.matrix(p + "attn_q_a.weight", s.q_lora_rank, h)
            self.vector(p + "attn_q_a_norm.weight", s.q_lora_rank)
            self.matrix(p + "attn_q_b.weight", s.heads * d, s.q_lora_rank)
            self.matrix(p + "attn_kv.weight", d, h)
            self.vector(p + "attn_kv_a_norm.weight", d)
            if kind in "CH":
                self.compressor(p + "attn_compressor", d, 4 if kind == "C" else 128)
            if kind == "C":
                self.compressor(p + "indexer_compressor", s.index_dim, 4)
                self.matrix(p + "indexer.attn_q_b.weight", s.index_heads * s.index_dim, s.q_lora_rank)
                self.vector(p + "indexer.proj.weight", s.index_heads, h, fill=("normal", 1 / np.sqrt(h)))
            self.matrix(p + "attn_output_a.weight", s.out_groups * s.out_rank, s.heads * d // s.out_groups)
            self.matrix(p + "attn_output_b.weight", h, s.out_groups * s.out_rank)
            self.vector(p + "ffn_norm.weight", h)
            self.experts(p)
            if i < s.hash_layers:
                self.list.append((p + "ffn_gate_tid2eid.weight", (self.vocab, s.experts_used), Q.I32,
                                  ("experts", s.experts)))
            else:
                self.vector(p + "exp_probs_b.bias", s.experts, fill=("normal", 0.01))
        return self.list

    def sinkhorn_mixer(self, p: str, mixes: int) -> None:
        """A DeepSeek-V4 mixer: the mixes' projection of the normed streams, their base and scales."""
        wide = self.s.streams * self.s.hidden
        self.vector(p + "_fn.weight", mixes, wide, fill=("normal", 1 / np.sqrt(wide)))
        self.vector(p + "_base.weight", mixes, fill=("normal", 0.5))
        self.vector(p + "_scale.weight", 3 if mixes > self.s.streams else 1, fill=("normal", 1.0))

    def compressor(self, p: str, width: int, ratio: int) -> None:
        """A compressor of `ratio` keys (two overlapping halves at ratio 4): values, their gates,
        the gates' position bias and the compressed entry's norm."""
        h, wide = self.s.hidden, width * (2 if ratio == 4 else 1)
        self.matrix(p + "_kv.weight", wide, h)
        self.matrix(p + "_gate.weight", wide, h)
        self.vector(p + "_ape.weight", ratio, wide, fill=("normal", 1.0))
        self.vector(p + "_norm.weight", width)

    def hyper_mixer(self, p: str, inject: bool = True) -> None:
        """A hyper-connection mixer over `streams` streams: the streams' norms, the gate's low-rank
        projections and each stream's write-back weight."""
        s, wide = self.s, self.s.streams * self.s.hidden
        self.vector(p + "_norm.weight", wide)
        self.vector(p + "_down.weight", s.streams_rank, wide, fill=("normal", 1 / np.sqrt(wide)))
        self.vector(p + "_up.weight", wide, s.streams_rank, fill=("normal", 1 / np.sqrt(s.streams_rank)))
        if inject:
            self.vector(p + "_inject.weight", s.streams, wide, fill=("normal", 1 / np.sqrt(wide)))

    def ngram_heads(self) -> list[int]:
        """The prime table size of each n-gram head (about 1000 rows each)."""
        primes = [n for n in range(1009, 2000) if all(n % d for d in range(2, int(n ** 0.5) + 1))]
        return primes[:(self.s.ngram - 1) * self.s.ngram_heads]

    def ngram_table(self) -> None:
        s = self.s
        width = s.hidden // ((s.ngram - 1) * s.ngram_heads)
        self.vector("per_layer_token_embd.weight", sum(self.ngram_heads()), width, fill=("normal", 1.0))

    def ngram_injection(self, p: str) -> None:
        s, h = self.s, self.s.hidden
        wide = s.streams * h
        self.matrix(p + "ple_key.weight", wide, h)
        self.matrix(p + "ple_value.weight", h, h)
        for name in ("key", "query", "conv"):
            self.vector(p + f"ple_norm_{name}.weight", wide)
        self.vector(p + "ple_conv1d.weight", wide, s.conv_kernel, fill=("normal", 1 / np.sqrt(s.conv_kernel)))

    def msa_indexer(self, p: str) -> None:
        """MiniMax Sparse Attention's indexer (a head of index_dim per KV head, one key), or
        Qwen4-Exp's (index_heads heads of index_dim)."""
        s, h = self.s, self.s.hidden
        heads = s.index_heads if s.family == "qwen4exp" else s.kv_heads
        self.matrix(p + "indexer.q_proj.weight", heads * s.index_dim, h)
        self.matrix(p + "indexer.k_proj.weight", s.index_dim, h)
        self.vector(p + "indexer.q_norm.weight", s.index_dim)
        self.vector(p + "indexer.k_norm.weight", s.index_dim)

    def kda(self, p: str) -> None:
        """A Kimi Delta Attention mixer: `heads` heads of ssm_head_dim."""
        s, h, d = self.s, self.s.hidden, self.s.ssm_head_dim
        inner = s.heads * d
        for name in ("q", "k", "v"):
            self.matrix(p + f"attn_{name}.weight", inner, h)
            self.vector(p + f"ssm_conv1d_{name}.weight", inner, 1, s.conv_kernel,
                        fill=("normal", 1 / np.sqrt(s.conv_kernel)))
        for name in ("f", "g"):   # the forget gate's and the output gate's low-rank projections
            self.matrix(p + f"ssm_{name}_a.weight", d, h)
            self.matrix(p + f"ssm_{name}_b.weight", inner, d)
        self.vector(p + "ssm_beta.weight", s.heads, h, fill=("normal", 1 / np.sqrt(h)))
        self.vector(p + "ssm_dt.bias", inner, fill=("dt_bias",))
        self.vector(p + "ssm_a", s.heads, 1, fill=("ssm_a",))
        self.vector(p + "ssm_norm.weight", d)
        self.matrix(p + "attn_output.weight", h, inner)

    def latent_attention(self, p: str) -> None:
        s, h = self.s, self.s.hidden
        nope = s.key_dim - s.rope_dim
        if s.q_lora_rank:
            self.matrix(p + "attn_q_a.weight", s.q_lora_rank, h)
            self.vector(p + "attn_q_a_norm.weight", s.q_lora_rank)
            self.matrix(p + "attn_q_b.weight", s.heads * s.key_dim, s.q_lora_rank)
        else:   # a "lite" file's queries from one projection
            self.matrix(p + "attn_q.weight", s.heads * s.key_dim, h)
        if s.family == "deepseek32":   # the lightning indexer, its query from the query latent
            self.matrix(p + "indexer.attn_q_b.weight", s.index_heads * s.index_dim, s.q_lora_rank)
            self.matrix(p + "indexer.attn_k.weight", s.index_dim, h)
            self.vector(p + "indexer.k_norm.weight", s.index_dim)
            self.vector(p + "indexer.k_norm.bias", s.index_dim, fill=("zeros",))
            self.vector(p + "indexer.proj.weight", s.index_heads, h, fill=("normal", 1 / np.sqrt(h)))
        self.matrix(p + "attn_kv_a_mqa.weight", s.kv_lora_rank + s.rope_dim, h)
        self.vector(p + "attn_kv_a_norm.weight", s.kv_lora_rank)
        self.matrix(p + "attn_k_b.weight", s.heads, s.kv_lora_rank, nope)
        self.matrix(p + "attn_v_b.weight", s.heads, s.value_dim, s.kv_lora_rank)
        self.matrix(p + "attn_output.weight", h, s.heads * s.value_dim)

    def mlp(self, p: str) -> None:
        h, f = self.s.hidden, self.s.ffn
        self.matrix(p + "ffn_gate.weight", f, h)
        self.matrix(p + "ffn_up.weight", f, h)
        self.matrix(p + "ffn_down.weight", h, f)

    def experts(self, p: str) -> None:
        s, h, e, f = self.s, self.s.hidden, self.s.experts, self.s.expert_ffn
        self.vector(p + "ffn_gate_inp.weight", e, h, fill=("normal", 1 / np.sqrt(h)))
        if s.family in GATED_EXPERTS:
            self.matrix(p + "ffn_gate_exps.weight", e, f, h)
        self.matrix(p + "ffn_up_exps.weight", e, f, h)
        self.matrix(p + "ffn_down_exps.weight", e, h, f)
        if s.family == "gpt-oss":
            self.vector(p + "ffn_gate_inp.bias", e, fill=("normal", 0.01))
            for name, width in (("gate", f), ("up", f), ("down", h)):
                self.vector(p + f"ffn_{name}_exps.bias", e, width, fill=("normal", 0.02))
        if s.family in SELECTION_BIAS:
            self.vector(p + "exp_probs_b.bias", e, fill=("normal", 0.01))
        if s.family in SHARED_EXPERT:
            if s.family != "nemotron_h_moe":
                self.matrix(p + "ffn_gate_shexp.weight", s.shared_ffn, h)
            self.matrix(p + "ffn_up_shexp.weight", s.shared_ffn, h)
            self.matrix(p + "ffn_down_shexp.weight", h, s.shared_ffn)
        if s.family in QWEN_HYBRID:
            self.vector(p + "ffn_gate_inp_shexp.weight", h, fill=("normal", 1 / np.sqrt(h)))

    def mamba2(self, p: str) -> None:
        s, h = self.s, self.s.hidden
        inner, bc = s.ssm_heads * s.ssm_head_dim, 2 * s.ssm_groups * s.ssm_state
        self.matrix(p + "ssm_in.weight", 2 * inner + bc + s.ssm_heads, h)
        self.vector(p + "ssm_conv1d.weight", inner + bc, s.conv_kernel, fill=("normal", 1 / np.sqrt(s.conv_kernel)))
        self.vector(p + "ssm_conv1d.bias", inner + bc, fill=("zeros",))
        self.vector(p + "ssm_dt.bias", s.ssm_heads, fill=("dt_bias",))
        self.vector(p + "ssm_a", s.ssm_heads, 1, fill=("ssm_a",))
        self.vector(p + "ssm_d", s.ssm_heads, 1)
        self.vector(p + "ssm_norm.weight", s.ssm_groups, inner // s.ssm_groups)
        self.matrix(p + "ssm_out.weight", h, inner)


def _float_data(rng: np.random.Generator, dims: tuple[int, ...], fill: tuple) -> np.ndarray:
    kind = fill[0]
    if kind == "ones":
        return np.ones(dims, dtype=np.float32)
    if kind == "zeros":
        return np.zeros(dims, dtype=np.float32)
    if kind == "normal":
        return (rng.standard_normal(dims) * fill[1]).astype(np.float32)
    if kind == "proportional":   # rope_freqs: the first pairs rotated, the others not (a huge divisor)
        return np.where(np.arange(dims[0]) < fill[1], 1.0, 1e30).astype(np.float32)
    if kind == "experts":     # a token-id table: distinct experts of fill[1] for each token
        return np.argsort(rng.random((dims[0], fill[1])), axis=1)[:, :dims[1]].astype(np.int32)
    if kind == "dt_bias":     # softplus^-1 of time steps log-uniform in [0.001, 0.1], as Mamba2 initialises them
        dt = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), dims))
        return np.log(np.expm1(dt)).astype(np.float32)
    return -rng.uniform(1, 16, dims).astype(np.float32)                  # ssm_a: A = -exp(A_log), A_log in [0, 2.8]


def _copy_tokenizer(source: GGUFIndex, w: GGUFWriter) -> None:
    """The BPE tokenizer of `source` (a gpt2-style GGUF such as SmolLM2's), every entry that
    tokenizes, so that a KL comparison with the source takes the two for the same tokenizer."""
    meta, TK = source.metadata, Keys.Tokenizer
    w.add_tokenizer_model(meta[TK.MODEL])
    if TK.PRE in meta:
        w.add_tokenizer_pre(meta[TK.PRE])
    w.add_token_list(source.strings(TK.LIST))
    w.add_token_types([int(t) for t in np.asarray(meta[TK.TOKEN_TYPE])])
    w.add_token_merges(source.strings(TK.MERGES))
    adders = {TK.BOS_ID: w.add_bos_token_id, TK.EOS_ID: w.add_eos_token_id, TK.UNK_ID: w.add_unk_token_id,
              TK.PAD_ID: w.add_pad_token_id, TK.ADD_BOS: w.add_add_bos_token, TK.ADD_PREFIX: w.add_add_space_prefix}
    for key, add in adders.items():
        if key in meta:
            add(meta[key])


def _add_hparams(w: GGUFWriter, s: Shape, vocab: int) -> None:
    w.add_block_count(s.layers)
    w.add_context_length(s.context)
    w.add_embedding_length(s.hidden)
    w.add_head_count(s.heads)
    w.add_vocab_size(vocab)
    if s.family == "nemotron_h_moe":     # per-layer widths and KV heads say which op a layer is
        w.add_feed_forward_length([s.expert_ffn if k == "E" else 0 for k in s.pattern])
        w.add_head_count_kv([s.kv_heads if k == "*" else 0 for k in s.pattern])
        w.add_layer_norm_eps(1e-5)
        w.add_ssm_conv_kernel(s.conv_kernel)
        w.add_ssm_state_size(s.ssm_state)
        w.add_ssm_group_count(s.ssm_groups)
        w.add_ssm_inner_size(s.ssm_heads * s.ssm_head_dim)
        w.add_ssm_time_step_rank(s.ssm_heads)
        w.add_expert_shared_feed_forward_length(s.shared_ffn)
        w.add_expert_shared_count(1)
        w.add_expert_weights_norm(True)
    else:
        w.add_feed_forward_length(s.ffn)
        w.add_layer_norm_rms_eps(1e-6)
        if s.family == "kimi-linear":    # KV heads on the latent-attention layers only
            w.add_head_count_kv([1 if s.kind(i) == "A" else 0 for i in range(s.layers)])
            w.add_kda_head_dim(s.ssm_head_dim)
            w.add_ssm_conv_kernel(s.conv_kernel)
        else:
            w.add_head_count_kv(1 if s.family in LATENT else s.kv_heads)
    if s.family not in LATENT:
        head = s.global_head_dim or s.key_dim
        w.add_key_length(head)
        w.add_value_length(head)
        w.add_rope_dimension_count(s.rope_dim or head)
    else:                               # as DeepSeek-V3's files: latent attention (YaRN x40 but Kimi's)
        w.add_key_length(s.kv_lora_rank + s.rope_dim)
        w.add_value_length(s.kv_lora_rank)
        w.add_key_length_mla(s.key_dim)
        w.add_value_length_mla(s.value_dim)
        w.add_rope_dimension_count(s.rope_dim)
        if s.q_lora_rank:
            w.add_q_lora_rank(s.q_lora_rank)
        w.add_kv_lora_rank(s.kv_lora_rank)
        if s.family != "kimi-linear":
            w.add_rope_scaling_type(RopeScalingType.YARN)
            w.add_rope_scaling_factor(40.0)
            w.add_rope_scaling_orig_ctx_len(s.context)
            w.add_rope_scaling_yarn_log_mul(0.1)
    if s.family == "gemma4":                 # global layers' head size and RoPE, then the sliding ones'
        w.add_key_length_swa(s.key_dim)
        w.add_value_length_swa(s.key_dim)
        w.add_rope_dimension_count_swa(s.key_dim)
        w.add_rope_freq_base(1e6)
        w.add_rope_freq_base_swa(1e4)
        w.add_sliding_window(s.sliding_window)
        w.add_sliding_window_pattern([s.is_sliding(i) for i in range(s.layers)])
        w.add_shared_kv_layers(s.shared_kv_layers)
        w.add_embedding_length_per_layer_input(s.per_layer_dim)
        w.add_final_logit_softcapping(30.0)
    if s.family in SIGMOID_ROUTED:           # leading dense layers, then sigmoid-routed experts and a shared one
        w.add_leading_dense_block_count(s.dense_layers)
        w.add_expert_shared_count(1)
        w.add_expert_gating_func(ExpertGatingFuncType.SIGMOID)
        w.add_expert_weights_norm(True)
        w.add_expert_weights_scale(2.0 if s.family == "minimax-m3" else 2.5)
        if s.expert_groups:
            w.add_expert_group_count(s.expert_groups)
            w.add_expert_group_used_count(s.groups_used)
    if s.family in ("deepseek32", "minimax-m3"):   # the indexer (MiniMax's: a head per KV head, over blocks of keys)
        w.add_indexer_head_count(s.index_heads if s.family == "deepseek32" else s.kv_heads)
        w.add_indexer_key_length(s.index_dim)
        w.add_indexer_top_k(s.index_top_k)
    if s.family == "minimax-m3":
        w.add_uint32(f"{s.family}.attention.indexer.block_size", s.index_block)
        w.add_uint32(f"{s.family}.attention.indexer.local_blocks", 1)
    if s.experts:
        w.add_expert_count(s.experts)
        w.add_expert_used_count(s.experts_used)
        w.add_expert_feed_forward_length(s.expert_ffn)
    if s.family in ("llama4", *QWEN_HYBRID):
        w.add_expert_shared_feed_forward_length(s.shared_ffn)
    if s.family in ("gpt-oss", "llama4"):    # gpt-oss: its sliding layers' span; llama4: chunks on
        w.add_sliding_window(s.sliding_window)
    if s.family == "llama4":
        w.add_interleave_moe_layer_step(s.moe_every)
    if s.family == "qwen4exp":
        _add_qwen4exp(w, s)
    if s.family == "deepseek4":
        _add_deepseek4(w, s)
    if s.family in QWEN_HYBRID:              # DeltaNet: key heads of ssm_state, value heads of ssm_head_dim
        w.add_full_attention_interval(s.attention_every)
        w.add_ssm_conv_kernel(s.conv_kernel)
        w.add_ssm_state_size(s.ssm_state)
        w.add_ssm_group_count(s.ssm_groups)
        w.add_ssm_inner_size(s.ssm_heads * s.ssm_head_dim)
        w.add_ssm_time_step_rank(s.ssm_heads)


def _add_deepseek4(w: GGUFWriter, s: Shape) -> None:
    """DeepSeek-V4's query latent, window, compressors, indexer, grouped output, hyper-connections,
    hash layers and routing (YaRN x4 past a quarter of the context, as its files scale RoPE)."""
    arch, ratios = s.family, {"S": 0, "C": 4, "H": 128}
    w.add_q_lora_rank(s.q_lora_rank)
    w.add_sliding_window(s.sliding_window)
    w.add_expert_shared_count(1)
    w.add_expert_weights_scale(1.5)
    w.add_expert_weights_norm(True)
    w.add_uint32(f"{arch}.expert_gating_func", GATING_CODES["sqrt_softplus"])   # gguf-py 0.19 has no name for it
    w.add_array(f"{arch}.swiglu_clamp_exp", [s.swiglu_limit] * s.layers)
    w.add_array(f"{arch}.swiglu_clamp_shexp", [s.swiglu_limit] * s.layers)
    w.add_indexer_head_count(s.index_heads)
    w.add_indexer_key_length(s.index_dim)
    w.add_indexer_top_k(s.index_top_k)
    w.add_uint32(f"{arch}.attention.output_group_count", s.out_groups)
    w.add_uint32(f"{arch}.attention.output_lora_rank", s.out_rank)
    w.add_array(f"{arch}.attention.compress_ratios", [ratios[k] for k in s.pattern])
    w.add_float32(f"{arch}.attention.compress_rope_freq_base", 160000.0)
    w.add_uint32(f"{arch}.hyper_connection.count", s.streams)
    w.add_uint32(f"{arch}.hyper_connection.sinkhorn_iterations", 20)
    w.add_float32(f"{arch}.hyper_connection.epsilon", 1e-6)
    w.add_uint32(f"{arch}.hash_layer_count", s.hash_layers)
    w.add_rope_scaling_type(RopeScalingType.YARN)
    w.add_rope_scaling_factor(4.0)
    w.add_rope_scaling_orig_ctx_len(s.context // 4)


def _add_qwen4exp(w: GGUFWriter, s: Shape) -> None:
    """The hyper-connections, the query-sparse indexer on the attention layers, the n-gram hash."""
    arch = s.family
    w.add_uint32(f"{arch}.hyper_connection.count", s.streams)
    w.add_uint32(f"{arch}.hyper_connection.low_rank", s.streams_rank)
    w.add_indexer_head_count(s.index_heads)
    w.add_indexer_key_length(s.index_dim)
    w.add_indexer_top_k(s.index_top_k)
    w.add_array(f"{arch}.attention.compress_ratios",
                [s.index_block if s.kind(i) == "A" else 0 for i in range(s.layers)])
    pairs = (s.rope_dim or s.key_dim) // 2
    w.add_rope_dimension_sections([pairs - 2 * (pairs // 3), pairs // 3, pairs // 3, 0])
    if not s.ngram:
        return
    sizes = _Tensors(s, 0).ngram_heads()
    w.add_array(f"{arch}.ple.layers", [0])
    w.add_uint32(f"{arch}.ple.ngram_size", s.ngram)
    w.add_uint32(f"{arch}.ple.heads_per_ngram", s.ngram_heads)
    w.add_uint32(f"{arch}.ple.conv_kernel", s.conv_kernel)
    w.add_uint32(f"{arch}.ple.eos_token_id", 0)
    w.add_embedding_length_per_layer_input(s.hidden // len(sizes))
    u64 = GGUFValueType.UINT64
    multipliers = [int(m) for m in np.random.default_rng(1).integers(1, 2 ** 45, s.ngram) * 2 + 1]
    w.add_key_value(f"{arch}.ple.layer_multipliers", multipliers, GGUFValueType.ARRAY, sub_type=u64)
    w.add_key_value(f"{arch}.ple.head_offsets", [int(o) for o in np.cumsum([0, *sizes[:-1]])], GGUFValueType.ARRAY,
                    sub_type=u64)
    w.add_key_value(f"{arch}.ple.head_vocab_sizes", sizes, GGUFValueType.ARRAY, sub_type=u64)


def write_synthetic_gguf(path: Path, shape: Shape, tokenizer_from: Path, seed: int = 0) -> Path:
    """Write the model to `path` (via a temporary name, so a killed write never looks finished)."""
    check_shape(shape)
    source = GGUFIndex(tokenizer_from)
    vocab = source.metadata[Keys.Tokenizer.LIST].count
    partial = path.with_name(path.name + ".partial")
    w = GGUFWriter(str(partial), shape.family)
    _add_hparams(w, shape, vocab)
    _copy_tokenizer(source, w)
    tensors = _Tensors(shape, vocab).build()
    plain = {Q.F32: np.float32, Q.I32: np.int32}
    for name, dims, qtype, _ in tensors:
        block, size = GGML_QUANT_SIZES[qtype]
        stored = dims if qtype in plain else (*dims[:-1], dims[-1] // block * size)  # bytes per row
        dtype = np.dtype(plain.get(qtype, np.uint8))
        w.add_tensor_info(name, stored, dtype, int(np.prod(stored)) * dtype.itemsize, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for _, dims, qtype, fill in tensors:
        if qtype in plain:
            w.write_tensor_data(_float_data(rng, dims, fill))
        else:
            _, fan_in, gain = fill
            block, size = GGML_QUANT_SIZES[qtype]
            raw = _blocks(rng, qtype, int(np.prod(dims)), fan_in, gain)
            w.write_tensor_data(raw.reshape(*dims[:-1], dims[-1] // block * size))
    w.close()
    partial.rename(path)
    return path


def synthetic_or_registered(alias: str, table: dict) -> Path:
    """A registered model, or a synthetic one from a settings file's [synthetic.ALIAS] table
    (written into data/models/ on first use)."""
    from ..gguf_io.registry import resolve_model
    from ..paths import MODELS_CACHE

    shape = table.get(alias)
    if shape is None:
        return resolve_model(alias)
    path = MODELS_CACHE / f"{alias}.gguf"
    if not path.is_file():
        shape = dict(shape)
        tokenizer = resolve_model(shape.pop("tokenizer_from"))
        print(f"writing {path} ...", file=sys.stderr)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_synthetic_gguf(path, Shape(**shape), tokenizer)
    return path


def main(argv=None) -> int:
    from .settings import read_settings

    parser = argparse.ArgumentParser(prog="python -m pipeline.tools.synthetic", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=Path("configs/synthetic.toml"))
    parser.add_argument("name", help="a [synthetic.NAME] table of the settings file")
    args = parser.parse_args(argv)
    try:
        table = read_settings(args.config).get("synthetic", {})
        if args.name not in table:
            raise UserError(f"{args.config} has no [synthetic.{args.name}] (it has: {', '.join(table) or 'none'})")
        print(synthetic_or_registered(args.name, table))
    except UserError as e:
        print(f"layercycle synthetic: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
