"""A decoder-only architecture over one GGUF file: embed, layers [a, b), head.

Subclasses (one module per family) state what differs: RoPE pairing, per-layer attention
window and RoPE base, embedding scale, activation, extra norms. Weights are read and
dequantized only when a layer, the embedding rows or the head are asked for.
"""
import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from gguf import MODEL_TENSOR, TENSOR_NAMES, Keys
from torch import nn

from ..dequant import dequantize
from ..errors import UserError
from ..gguf_file import GGUFIndex
from .blocks import Attention, RopeSpec, causal_mask, gated_mlp, rms_norm, rope_tables


@dataclass(frozen=True)
class HParams:
    n_layers: int
    hidden: int
    n_head: int
    n_kv: int
    head_dim: int
    eps: float
    context_length: int
    vocab: int


class Tables:
    """RoPE tables and attention masks of one sequence length, built once per window task."""

    def __init__(self, n_pos: int, device, dtype):
        self.n_pos, self.device, self.dtype = n_pos, device, dtype
        self._rope, self._mask = {}, {}

    def rope(self, spec: RopeSpec) -> tuple[torch.Tensor, torch.Tensor]:
        if spec not in self._rope:
            self._rope[spec] = rope_tables(spec, self.n_pos, self.device, self.dtype)
        return self._rope[spec]

    def mask(self, window: int | None) -> torch.Tensor | None:
        if window not in self._mask:
            self._mask[window] = causal_mask(self.n_pos, window, self.device)
        return self._mask[window]


class DecoderLayer(nn.Module):
    """x + [post_norm](attn(norm(x))), then h + [post_norm](mlp(norm(h)))."""

    def __init__(self, w: dict[str, torch.Tensor], hp: HParams, spec: RopeSpec, window: int | None,
                 scale: float, act):
        super().__init__()
        self.w, self.hp, self.spec, self.window, self.act = w, hp, spec, window, act
        attn_w = {k: w[k] for k in ("q", "k", "v", "o", "q_bias", "k_bias", "v_bias", "q_norm", "k_norm") if k in w}
        self.attn = Attention(attn_w, hp.n_head, hp.n_kv, hp.head_dim, scale, hp.eps)

    def forward(self, x: torch.Tensor, tables: Tables) -> torch.Tensor:
        # x: [B, T, hidden]
        w, eps = self.w, self.hp.eps
        cos, sin = tables.rope(self.spec)
        a = self.attn(rms_norm(x, w["attn_norm"], eps), cos, sin, self.spec, tables.mask(self.window))
        h = x + (rms_norm(a, w["attn_post_norm"], eps) if "attn_post_norm" in w else a)
        m = gated_mlp(rms_norm(h, w["ffn_norm"], eps), w, self.act)
        return h + (rms_norm(m, w["ffn_post_norm"], eps) if "ffn_post_norm" in w else m)


# layer weight key -> (GGUF tensor, suffix); tensors a file lacks are simply absent
LAYER_TENSORS = {
    "attn_norm": (MODEL_TENSOR.ATTN_NORM, "weight"),
    "q": (MODEL_TENSOR.ATTN_Q, "weight"), "k": (MODEL_TENSOR.ATTN_K, "weight"),
    "v": (MODEL_TENSOR.ATTN_V, "weight"), "o": (MODEL_TENSOR.ATTN_OUT, "weight"),
    "q_bias": (MODEL_TENSOR.ATTN_Q, "bias"), "k_bias": (MODEL_TENSOR.ATTN_K, "bias"),
    "v_bias": (MODEL_TENSOR.ATTN_V, "bias"),
    "q_norm": (MODEL_TENSOR.ATTN_Q_NORM, "weight"), "k_norm": (MODEL_TENSOR.ATTN_K_NORM, "weight"),
    "attn_post_norm": (MODEL_TENSOR.ATTN_POST_NORM, "weight"),
    "ffn_norm": (MODEL_TENSOR.FFN_NORM, "weight"),
    "gate": (MODEL_TENSOR.FFN_GATE, "weight"), "up": (MODEL_TENSOR.FFN_UP, "weight"),
    "down": (MODEL_TENSOR.FFN_DOWN, "weight"),
    "ffn_post_norm": (MODEL_TENSOR.FFN_POST_NORM, "weight"),
}
REQUIRED_LAYER_TENSORS = ("attn_norm", "q", "k", "v", "o", "ffn_norm", "gate", "up", "down")


class DecoderArch:
    neox_rope = False           # llama GGUFs store Q/K permuted for consecutive-pair RoPE
    activation = staticmethod(F.silu)
    embed_scale: float | None = None

    def __init__(self, gguf: GGUFIndex):
        self.gguf = gguf
        self.hp = self.read_hparams()

    # -- metadata --------------------------------------------------------------------------
    def key(self, template: str, default=None):
        value = self.gguf.arch_value(template, default)
        if value is None:
            raise UserError(f"{self.gguf.path}: missing metadata key {template.format(arch=self.gguf.architecture)}")
        return value

    def read_hparams(self) -> HParams:
        hidden, n_head = int(self.key(Keys.LLM.EMBEDDING_LENGTH)), int(self.key(Keys.Attention.HEAD_COUNT))
        n_kv = int(self.key(Keys.Attention.HEAD_COUNT_KV, n_head))
        tokens = self.gguf.metadata.get(Keys.Tokenizer.LIST)
        vocab = self.key(Keys.LLM.VOCAB_SIZE, getattr(tokens, "count", 0))
        return HParams(
            n_layers=int(self.key(Keys.LLM.BLOCK_COUNT)), hidden=hidden, n_head=n_head, n_kv=n_kv,
            head_dim=int(self.key(Keys.Attention.KEY_LENGTH, hidden // n_head)),
            eps=float(self.key(Keys.Attention.LAYERNORM_RMS_EPS)),
            context_length=int(self.key(Keys.LLM.CONTEXT_LENGTH)), vocab=int(vocab))

    def attention_scale(self) -> float:
        return float(self.key(Keys.Attention.SCALE, 1.0 / math.sqrt(self.hp.head_dim)))

    def rope_spec(self, layer: int) -> RopeSpec:
        return self.trunk_rope

    @functools.cached_property
    def trunk_rope(self) -> RopeSpec:
        """The RoPE of the file's metadata, read (and `rope_freqs` dequantized) once."""
        factors = None
        name = TENSOR_NAMES[MODEL_TENSOR.ROPE_FREQS] + ".weight"
        if name in self.gguf.tensors:
            factors = tuple(self.tensor(name, "cpu", torch.float32).tolist())
        scale = 1.0
        if self.key(Keys.Rope.SCALING_TYPE, "none") == "linear":
            scale = float(self.key(Keys.Rope.SCALING_FACTOR, 1.0))
        return RopeSpec(dim=int(self.key(Keys.Rope.DIMENSION_COUNT, self.hp.head_dim)),
                        base=float(self.key(Keys.Rope.FREQ_BASE, 10000.0)), neox=self.neox_rope,
                        scale=scale, freq_factors=factors)

    def attention_window(self, layer: int) -> int | None:
        return None

    # -- weights ---------------------------------------------------------------------------
    def tensor(self, name: str, device, dtype) -> torch.Tensor:
        if name not in self.gguf.tensors:
            raise UserError(f"{self.gguf.path}: missing tensor {name}")
        info = self.gguf.tensors[name]
        return dequantize(self.gguf.raw(name), info.qtype, device, name).to(dtype)

    def load_layer(self, i: int, device, dtype) -> DecoderLayer:
        w = {}
        for key, (kind, suffix) in LAYER_TENSORS.items():
            name = f"{TENSOR_NAMES[kind].format(bid=i)}.{suffix}"
            if name in self.gguf.tensors:
                w[key] = self.tensor(name, device, dtype)
            elif key in REQUIRED_LAYER_TENSORS:
                raise UserError(f"{self.gguf.path}: missing tensor {name}")
        return DecoderLayer(w, self.hp, self.rope_spec(i), self.attention_window(i),
                            self.attention_scale(), self.activation)

    def embed(self, ids: torch.Tensor, device, dtype) -> torch.Tensor:
        """ids [B, T] -> hidden [B, T, hidden]; dequantizes only the rows that occur."""
        name = TENSOR_NAMES[MODEL_TENSOR.TOKEN_EMBD] + ".weight"
        info = self.gguf.tensors[name]
        unique, inverse = torch.unique(ids, return_inverse=True)
        rows = self.gguf.raw(name)[unique.numpy()]
        table = dequantize(rows, info.qtype, device, name).to(dtype)  # [U, hidden]
        x = table[inverse.to(device)]
        if self.embed_scale is not None:
            x = x * torch.tensor(self.embed_scale, dtype=dtype, device=device)
        return x

    def load_head(self, device, dtype) -> "Head":
        out = TENSOR_NAMES[MODEL_TENSOR.OUTPUT] + ".weight"
        if out not in self.gguf.tensors:  # tied embeddings
            out = TENSOR_NAMES[MODEL_TENSOR.TOKEN_EMBD] + ".weight"
        norm = self.tensor(TENSOR_NAMES[MODEL_TENSOR.OUTPUT_NORM] + ".weight", device, dtype)
        return Head(norm, self.tensor(out, device, dtype), self.hp.eps)


class Head(nn.Module):
    """Final norm + LM head: hidden [N, hidden] -> logits [N, vocab]."""

    def __init__(self, norm: torch.Tensor, weight: torch.Tensor, eps: float):
        super().__init__()
        self.norm, self.weight, self.eps = norm, weight, eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(rms_norm(x, self.norm, self.eps), self.weight)
