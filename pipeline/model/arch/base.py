"""A decoder-only architecture over one GGUF file: embed, layers [a, b), head.

A layer is a list of residual steps, x + [post_norm](op(norm(x))), whose ops are attention,
a recurrent mixer (Mamba2, Gated DeltaNet) or a feed-forward block (dense or mixture of
experts). Subclasses (one module per family) state what differs: which op each layer has,
RoPE pairing, per-layer attention window and RoPE base, embedding scale, activation. Weights
are read and dequantized only when a layer, the embedding rows or the head are asked for.
"""
import functools
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from gguf import MODEL_TENSOR, TENSOR_NAMES, Keys
from torch import nn

from ...errors import UserError
from ...gguf_io.dequant import dequantize
from ...gguf_io.reader import GGUFIndex
from ..weight_block import WeightBlock
from .blocks import Attention, RopeSpec, causal_mask, rms_norm, rope_tables
from .ffn import MLP, MoE, Routing

T = MODEL_TENSOR


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


def read_tensor(gguf: GGUFIndex, name: str, device, dtype, weights: WeightBlock | None = None) -> torch.Tensor:
    """A tensor of the file, dequantized on `device` and cast to `dtype`, inside `weights`
    where it is given and has room."""
    if name not in gguf.tensors:
        raise UserError(f"{gguf.path}: missing tensor {name}")
    info = gguf.tensors[name]
    out = weights.take(info.shape, dtype) if weights is not None else None
    t = dequantize(gguf.raw(name), info.qtype, device, name, dtype, out=out)
    gguf.release_pages(name)
    return t


class BlockTensors:
    """The tensors of block `i`, dequantized on request (into `weights` where given); counts
    the bytes it holds."""

    def __init__(self, gguf: GGUFIndex, i: int, device, dtype, weights: WeightBlock | None = None):
        self.gguf, self.i, self.device, self.dtype, self.weights = gguf, i, device, dtype, weights
        self.nbytes, self.read = 0, set()

    def name(self, kind: MODEL_TENSOR, suffix: str | None = "weight") -> str:
        base = TENSOR_NAMES[kind].format(bid=self.i)
        return f"{base}.{suffix}" if suffix else base

    def has(self, kind: MODEL_TENSOR, suffix: str | None = "weight") -> bool:
        return self.name(kind, suffix) in self.gguf.tensors

    def __call__(self, kind: MODEL_TENSOR, suffix: str | None = "weight", required: bool = True,
                 dtype: torch.dtype | None = None) -> torch.Tensor | None:
        name = self.name(kind, suffix)
        if name not in self.gguf.tensors and not required:
            return None
        t = read_tensor(self.gguf, name, self.device, dtype or self.dtype, self.weights)
        self.read.add(name)
        self.nbytes += t.numel() * t.element_size()
        return t

    def check_all_read(self) -> None:
        """A tensor of the block that the layer did not read means a variant we would compute
        wrongly (merged or latent experts, extra projections): refuse it rather than guess."""
        unread = sorted(t.name for t in self.gguf.layer_tensors(self.i) if t.name not in self.read)
        if unread:
            raise UserError(f"{self.gguf.path}: tensor {unread[0]} is not part of the {self.gguf.architecture} "
                            f"layer layercycle computes; this variant of the architecture is not supported")


class Residual(nn.Module):
    """x + [post_norm](op(norm(x)))."""

    def __init__(self, norm: torch.Tensor, op: nn.Module, eps: float, post_norm: torch.Tensor | None = None):
        super().__init__()
        self.norm, self.op, self.eps, self.post_norm = norm, op, eps, post_norm

    def forward(self, x: torch.Tensor, tables: Tables, state: dict | None) -> torch.Tensor:
        y = self.op(rms_norm(x, self.norm, self.eps), tables, state)
        return x + (rms_norm(y, self.post_norm, self.eps) if self.post_norm is not None else y)


class DecoderLayer(nn.Module):
    def __init__(self, steps: list[Residual], nbytes: int):
        super().__init__()
        self.steps, self.nbytes = steps, nbytes

    def forward(self, x: torch.Tensor, tables: Tables, state: dict | None = None) -> torch.Tensor:
        # x: [B, T, hidden]; state: recurrent state carried in and out (None: zero for every row)
        for step in self.steps:
            x = step(x, tables, state)
        return x


class DecoderArch:
    neox_rope = False           # llama GGUFs store Q/K permuted for consecutive-pair RoPE
    activation = staticmethod(F.silu)
    embed_scale: float | None = None
    expert_gating = "softmax"   # how router logits become expert weights (llama.cpp fixes it per family)

    def __init__(self, gguf: GGUFIndex):
        self.gguf = gguf
        self.hp = self.read_hparams()

    # -- metadata --------------------------------------------------------------------------
    def key(self, template: str, default=None):
        value = self.gguf.arch_value(template, default)
        if value is None:
            raise UserError(f"{self.gguf.path}: missing metadata key {template.format(arch=self.gguf.architecture)}")
        return value

    def layer_key(self, template: str, i: int, default=None):
        """A key that may hold one value per layer (an array) or one for all."""
        value = self.key(template, default)
        return value[i] if isinstance(value, (np.ndarray, list)) else value

    def read_hparams(self) -> HParams:
        # hybrid models list heads per layer (0 on recurrent layers): the attention layers' count
        hidden, n_head = int(self.key(Keys.LLM.EMBEDDING_LENGTH)), int(np.max(self.key(Keys.Attention.HEAD_COUNT)))
        n_kv = int(np.max(self.key(Keys.Attention.HEAD_COUNT_KV, n_head)))
        tokens = self.gguf.metadata.get(Keys.Tokenizer.LIST)
        vocab = self.key(Keys.LLM.VOCAB_SIZE, getattr(tokens, "count", 0))
        return HParams(
            # multi-token-prediction blocks follow the trunk; a perplexity pass never runs them
            n_layers=int(self.key(Keys.LLM.BLOCK_COUNT)) - int(self.key(Keys.LLM.NEXTN_PREDICT_LAYERS, 0)), hidden=hidden, n_head=n_head, n_kv=n_kv,
            head_dim=int(self.key(Keys.Attention.KEY_LENGTH, hidden // max(n_head, 1))),
            eps=self.rms_eps(),
            context_length=int(self.key(Keys.LLM.CONTEXT_LENGTH)), vocab=int(vocab))

    def rms_eps(self) -> float:
        return float(self.key(Keys.Attention.LAYERNORM_RMS_EPS))

    def attention_scale(self) -> float:
        return float(self.key(Keys.Attention.SCALE, 1.0 / math.sqrt(self.hp.head_dim)))

    def rope_spec(self, layer: int) -> RopeSpec | None:
        return self.trunk_rope

    @functools.cached_property
    def trunk_rope(self) -> RopeSpec:
        """The RoPE of the file's metadata, read (and `rope_freqs` dequantized) once."""
        factors = None
        name = TENSOR_NAMES[T.ROPE_FREQS] + ".weight"
        if name in self.gguf.tensors:
            factors = tuple(read_tensor(self.gguf, name, "cpu", torch.float32).tolist())
        scale = 1.0
        if self.key(Keys.Rope.SCALING_TYPE, "none") == "linear":
            scale = float(self.key(Keys.Rope.SCALING_FACTOR, 1.0))
        return RopeSpec(dim=int(self.key(Keys.Rope.DIMENSION_COUNT, self.hp.head_dim)),
                        base=float(self.key(Keys.Rope.FREQ_BASE, 10000.0)), neox=self.neox_rope,
                        scale=scale, freq_factors=factors)

    def attention_window(self, layer: int) -> int | None:
        return None

    # -- layers ----------------------------------------------------------------------------
    def load_layer(self, i: int, device, dtype, weights: WeightBlock | None = None) -> DecoderLayer:
        t = BlockTensors(self.gguf, i, device, dtype, weights)
        steps = self.layer_steps(i, t)
        t.check_all_read()
        return DecoderLayer(steps, t.nbytes)

    def layer_steps(self, i: int, t: BlockTensors) -> list[Residual]:
        """Attention then feed-forward, each with its pre-norm and (where present) post-norm."""
        eps = self.hp.eps
        return [Residual(t(T.ATTN_NORM), self.attention(i, t), eps, t(T.ATTN_POST_NORM, required=False)),
                Residual(t(T.FFN_NORM), self.ffn(i, t), eps, t(T.FFN_POST_NORM, required=False))]

    def attention(self, i: int, t: BlockTensors, gated: bool = False) -> Attention:
        w = {"q": t(T.ATTN_Q), "k": t(T.ATTN_K), "v": t(T.ATTN_V), "o": t(T.ATTN_OUT)}
        optional = {"q_bias": (T.ATTN_Q, "bias"), "k_bias": (T.ATTN_K, "bias"), "v_bias": (T.ATTN_V, "bias"),
                    "o_bias": (T.ATTN_OUT, "bias"), "q_norm": (T.ATTN_Q_NORM, "weight"),
                    "k_norm": (T.ATTN_K_NORM, "weight")}
        w |= {k: v for k, (kind, suffix) in optional.items() if (v := t(kind, suffix, required=False)) is not None}
        n_head = int(self.layer_key(Keys.Attention.HEAD_COUNT, i))
        n_kv = int(self.layer_key(Keys.Attention.HEAD_COUNT_KV, i, n_head))
        return Attention(w, n_head, n_kv, self.hp.head_dim, self.attention_scale(), self.hp.eps,
                         self.rope_spec(i), self.attention_window(i), gated)

    def ffn(self, i: int, t: BlockTensors) -> nn.Module:
        """Mixture of experts where the block has a router, else the dense (gated) MLP."""
        if t.has(T.FFN_GATE_INP):
            return self.moe(i, t)
        return MLP(t(T.FFN_UP), t(T.FFN_DOWN), t(T.FFN_GATE, required=False), self.activation,
                   t(T.FFN_UP, "bias", required=False), t(T.FFN_DOWN, "bias", required=False))

    def normalizes_expert_weights(self) -> bool:
        """Softmax families renormalise their top-k weights whatever the file says."""
        return True

    def routing(self, i: int) -> Routing:
        return Routing(n_used=int(self.layer_key(Keys.LLM.EXPERT_USED_COUNT, i)), gating=self.expert_gating,
                       normalize=self.normalizes_expert_weights(),
                       scale=float(self.key(Keys.LLM.EXPERT_WEIGHTS_SCALE, 0.0)) or 1.0)

    def moe(self, i: int, t: BlockTensors) -> MoE:
        shared = None
        if t.has(T.FFN_UP_SHEXP):
            shared = MLP(t(T.FFN_UP_SHEXP), t(T.FFN_DOWN_SHEXP), t(T.FFN_GATE_SHEXP, required=False),
                         self.activation)
        routing_dtype = torch.promote_types(t.dtype, torch.float32)
        return MoE(router=t(T.FFN_GATE_INP, dtype=routing_dtype), up=t(T.FFN_UP_EXP), down=t(T.FFN_DOWN_EXP),
                   gate=t(T.FFN_GATE_EXP, required=False), act=self.activation, routing=self.routing(i),
                   selection_bias=t(T.FFN_EXP_PROBS_B, "bias", required=False, dtype=routing_dtype),
                   shared=shared, shared_gate=t(T.FFN_GATE_INP_SHEXP, required=False))

    # -- embedding and head ----------------------------------------------------------------
    def embed(self, ids: torch.Tensor, device, dtype) -> torch.Tensor:
        """ids [B, T] -> hidden [B, T, hidden]; dequantizes only the rows that occur."""
        name = TENSOR_NAMES[T.TOKEN_EMBD] + ".weight"
        info = self.gguf.tensors[name]
        unique, inverse = torch.unique(ids, return_inverse=True)
        rows = self.gguf.raw(name)[unique.numpy()]
        table = dequantize(rows, info.qtype, device, name, dtype)  # [U, hidden]
        x = table[inverse.to(device)]
        if self.embed_scale is not None:
            x = x * torch.tensor(self.embed_scale, dtype=dtype, device=device)
        return x

    def load_head(self, device, dtype) -> "Head":
        out = TENSOR_NAMES[T.OUTPUT] + ".weight"
        if out not in self.gguf.tensors:  # tied embeddings
            out = TENSOR_NAMES[T.TOKEN_EMBD] + ".weight"
        norm = read_tensor(self.gguf, TENSOR_NAMES[T.OUTPUT_NORM] + ".weight", device, dtype)
        return Head(norm, read_tensor(self.gguf, out, device, dtype), self.hp.eps)


class Head(nn.Module):
    """Final norm + LM head: hidden [N, hidden] -> logits [N, vocab]."""

    def __init__(self, norm: torch.Tensor, weight: torch.Tensor, eps: float):
        super().__init__()
        self.norm, self.weight, self.eps = norm, weight, eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(rms_norm(x, self.norm, self.eps), self.weight)

    def logit_slices(self, x: torch.Tensor, width: int):
        """x [N, hidden] -> (first id, float32 logits [N, <= width]) per slice of the vocabulary,
        so that all N x vocab logits never exist at once."""
        normed = rms_norm(x, self.norm, self.eps)
        for start in range(0, self.weight.shape[0], width):
            yield start, F.linear(normed, self.weight[start:start + width]).float()
