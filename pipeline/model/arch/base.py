"""A decoder-only architecture over one GGUF file: embed, layers [a, b), head.

Each layer's facts (which mixer and feed-forward block, heads, head sizes, attention span,
RoPE) are read from the metadata once, into a `LayerSpec` per layer. A layer is a module tree
of residual steps, x + [post_norm](op(norm(x))), whose ops are a mixer (attention, Mamba2,
Gated DeltaNet) or a feed-forward block (dense or mixture of experts). Subclasses (one module
per family) state what differs: the spec of each layer, RoPE pairing, embedding scale,
activation, how the logits end. Weights are read and dequantized only when a layer, the
embedding rows or the head are asked for.
"""
import functools
import math
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F
from gguf import MODEL_TENSOR, TENSOR_NAMES, Keys
from torch import nn

from ...errors import UserError
from ...gguf_io.dequant import dequantize
from ...gguf_io.reader import GGUFIndex
from ..scoring import WIDENED_SLICE_BYTES
from ..weight_block import WeightBlock, held_dtype
from .audit import GATING_CODES, NEUTRAL, close_to, equals, never, refuse_settings_not_computed
from .blocks import (
    Attention,
    AttentionSpec,
    Temperature,
    Weights,
    causal_mask,
    module_bytes,
    rms_norm,
    temperature_factors,
)
from .experts import HeldExperts, SlicedExperts, expert_tensor_names, split_gate_up
from .ffn import MLP, MoE, Routing
from .rope import RopeSpec, read_rope, rope_tables, text_unrotated_pairs
from .shapes import check_shapes, qkv_rows

MT = MODEL_TENSOR


@dataclass(frozen=True)
class LayerSpec:
    """What one layer computes, read from the metadata once."""
    index: int
    mixer: str                                # "attention", "mamba2", "delta_net"; "": none
    ffn: str                                  # "mlp", "moe"; "": none
    attention: AttentionSpec | None = None    # where the mixer is attention


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
    """RoPE tables, attention masks and query temperatures of one sequence length, built once per
    layer-window task."""

    def __init__(self, n_pos: int, device, dtype):
        self.n_pos, self.device, self.dtype = n_pos, device, dtype
        self._rope, self._mask, self._temperature = {}, {}, {}

    def rope(self, spec: RopeSpec) -> tuple[torch.Tensor, torch.Tensor]:
        if spec not in self._rope:
            self._rope[spec] = rope_tables(spec, self.n_pos, self.device, self.dtype)
        return self._rope[spec]

    def mask(self, span: int | None, chunk: int | None = None) -> torch.Tensor | None:
        if (span, chunk) not in self._mask:
            self._mask[span, chunk] = causal_mask(self.n_pos, span, self.device, chunk)
        return self._mask[span, chunk]

    def temperature(self, t: Temperature) -> torch.Tensor:
        if t not in self._temperature:
            self._temperature[t] = temperature_factors(t, self.n_pos, self.device, self.dtype)
        return self._temperature[t]


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
    """The tensors of block `i`, dequantized on request (into `weights` where given); remembers
    which it read."""

    def __init__(self, gguf: GGUFIndex, i: int, device, dtype, weights: WeightBlock | None = None,
                 expert_slices: int = 1):
        self.gguf, self.i, self.device, self.dtype, self.weights = gguf, i, device, dtype, weights
        self.expert_slices = expert_slices   # > 1: the routed experts are read a slice at a time
        self.read = set()

    def name(self, kind: MODEL_TENSOR, suffix: str | None = "weight") -> str:
        base = TENSOR_NAMES[kind].format(bid=self.i)
        return f"{base}.{suffix}" if suffix else base

    def has(self, kind: MODEL_TENSOR, suffix: str | None = "weight") -> bool:
        return self.name(kind, suffix) in self.gguf.tensors

    def __call__(self, kind: MODEL_TENSOR, suffix: str | None = "weight", required: bool = True) -> torch.Tensor | None:
        name = self.name(kind, suffix)
        if name not in self.gguf.tensors and not required:
            return None
        t = read_tensor(self.gguf, name, self.device, held_dtype(name, self.dtype), self.weights)
        self.read.add(name)
        return t

    def unheld(self, kind: MODEL_TENSOR, suffix: str = "weight") -> torch.Tensor:
        """A tensor dequantized outside the window's block, for one the layer turns into another
        at load (`keep` puts the result where the block has room for it)."""
        name = self.name(kind, suffix)
        self.read.add(name)
        return read_tensor(self.gguf, name, self.device, held_dtype(name, self.dtype))

    def keep(self, t: torch.Tensor) -> torch.Tensor:
        """`t` moved into the window's block where it has room (else as it is)."""
        view = self.weights.take(tuple(t.shape), t.dtype) if self.weights is not None else None
        return t if view is None else view.copy_(t)

    def check_all_read(self) -> None:
        """A tensor of the block that the layer did not read means a variant we would compute
        wrongly (merged or latent experts, extra projections): refuse it rather than guess."""
        unread = sorted(t.name for t in self.gguf.layer_tensors(self.i) if t.name not in self.read)
        if unread:
            raise UserError(f"{self.gguf.path}: tensor {unread[0]} is not part of the {self.gguf.architecture} "
                            f"layer layercycle computes; this variant of the architecture is not supported")


class Residual(Weights):
    """x + [post_norm](op(norm(x)))."""

    def __init__(self, norm: torch.Tensor, op: nn.Module, eps: float, post_norm: torch.Tensor | None = None):
        super().__init__({"norm": norm, "post_norm": post_norm})
        self.op, self.eps = op, eps

    def forward(self, x: torch.Tensor, tables: Tables, state: dict | None) -> torch.Tensor:
        return self.add(x, self.op(self.op_input(x), tables, state))

    def op_input(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.norm, self.eps)

    def add(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The residual stream x with the op's output y added."""
        return x + (rms_norm(y, self.post_norm, self.eps) if self.post_norm is not None else y)


class DecoderLayer(nn.Module):
    def __init__(self, spec: LayerSpec, steps: list[Residual]):
        super().__init__()
        self.spec, self.steps = spec, nn.ModuleList(steps)

    @property
    def nbytes(self) -> int:
        return module_bytes(self)

    def extra_repr(self) -> str:
        return f"layer {self.spec.index}: {self.spec.mixer or 'no mixer'}, {self.spec.ffn or 'no feed-forward'}"

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
    honours: frozenset[str] = frozenset()   # keys of audit.NEUTRAL the family computes
    fused_gate_up_experts = False           # llama.cpp loads ffn_gate_up_exps for this family
    ffn_norm = MT.FFN_NORM                  # the FFN's pre-norm (some families store it as the post-attention norm)
    swa_period = 0                          # families with sliding-window layers: the last of each period is global
    multi_axis_rope = ""                    # "sections" or "interleaved": the family reads rope.dimension_sections
    weight_before_experts = False           # the routing weight scales the expert's input, not its output
    attention_class = Attention             # a family's attention that SDPA cannot express overrides `attend`
    numerics = 1                            # raised by a change of this family's math (pipeline/numerics.py)

    def __init__(self, gguf: GGUFIndex):
        self.gguf = gguf
        self.hp = self.read_hparams()
        self.expert_gating = self.read_gating()
        refuse_settings_not_computed(self)
        self.groups = self.expert_groups()
        self.specs = [self.layer_spec(i) for i in range(self.hp.n_layers)]
        check_shapes(self)

    def settings_not_computed(self) -> dict:
        """The settings this family does not compute, each with the test of a value that
        leaves its math unchanged (audit.py)."""
        gating = GATING_CODES.get(self.expert_gating)   # None: llama.cpp fixes one the key cannot name
        neutral = {**NEUTRAL, Keys.Attention.SCALE: close_to(self.attention_scale()),
                   Keys.LLM.EXPERT_GATING_FUNC: equals(gating) if gating is not None else never}
        if self.multi_axis_rope:
            del neutral[Keys.Rope.DIMENSION_SECTIONS]
        return {key: test for key, test in neutral.items() if key not in self.honours}

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
        # multi-token-prediction blocks follow the trunk; a perplexity pass never runs them
        n_layers = int(self.key(Keys.LLM.BLOCK_COUNT)) - int(self.key(Keys.LLM.NEXTN_PREDICT_LAYERS, 0))
        return HParams(n_layers=n_layers, hidden=hidden, n_head=n_head, n_kv=n_kv,
                       head_dim=int(self.key(Keys.Attention.KEY_LENGTH, hidden // max(n_head, 1))),
                       eps=self.rms_eps(), context_length=int(self.key(Keys.LLM.CONTEXT_LENGTH)), vocab=int(vocab))

    def rms_eps(self) -> float:
        return float(self.key(Keys.Attention.LAYERNORM_RMS_EPS))

    def has_tensor(self, i: int, kind: MODEL_TENSOR, suffix: str = "weight") -> bool:
        return f"{TENSOR_NAMES[kind].format(bid=i)}.{suffix}" in self.gguf.tensors

    # -- the spec of each layer ------------------------------------------------------------
    def layer_spec(self, i: int) -> LayerSpec:
        """Attention, then experts where the block has a router, else the dense MLP."""
        return LayerSpec(i, "attention", self.ffn_kind(i), self.attention_spec(i))

    def ffn_kind(self, i: int) -> str:
        """Families that read leading_dense_block_count: dense below it, experts from it on (as
        llama.cpp's loaders); the others: experts where the block has a router."""
        if Keys.LLM.LEADING_DENSE_BLOCK_COUNT in self.honours:
            return "mlp" if i < int(self.key(Keys.LLM.LEADING_DENSE_BLOCK_COUNT, 0)) else "moe"
        return "moe" if self.has_tensor(i, MT.FFN_GATE_INP) else "mlp"

    def attention_spec(self, i: int) -> AttentionSpec:
        n_head = int(self.layer_key(Keys.Attention.HEAD_COUNT, i))
        return AttentionSpec(n_head=n_head, n_kv=int(self.layer_key(Keys.Attention.HEAD_COUNT_KV, i, n_head)),
                             key_dim=self.hp.head_dim,
                             value_dim=int(self.key(Keys.Attention.VALUE_LENGTH, self.hp.head_dim)),
                             scale=self.attention_scale(), rope=self.trunk_rope)

    def yarn_mscales(self) -> tuple[float, float]:
        """(mscale, mscale_all_dim) of llama.cpp's YaRN attention factor; mscale_all_dim 0: the
        family reads no rope.scaling.yarn_log_mul (a file that sets one is refused)."""
        return 1.0, 0.0

    def is_sliding(self, i: int) -> bool:
        """llama.cpp's load_swa_pattern: a per-layer array, or a period (from the file or the
        family's `swa_period`) whose last layer attends globally; period 0: every layer slides."""
        pattern = self.gguf.arch_value(Keys.Attention.SLIDING_WINDOW_PATTERN)
        if isinstance(pattern, np.ndarray):
            return bool(pattern[i])
        period = int(pattern) if pattern is not None else self.swa_period
        return period == 0 or i % period < period - 1

    def attention_scale(self) -> float:
        """Q.K's scale: llama.cpp's 1 / sqrt(head size) for these families, whose loaders do not read
        attention.scale (a file that sets it to another value is refused)."""
        return 1.0 / math.sqrt(self.hp.head_dim)

    @functools.cached_property
    def trunk_rope(self) -> RopeSpec:
        """The RoPE of the file's metadata, read (and `rope_freqs` dequantized) once."""
        factors = None
        name = TENSOR_NAMES[MT.ROPE_FREQS] + ".weight"
        if name in self.gguf.tensors:
            factors = tuple(read_tensor(self.gguf, name, "cpu", torch.float32).tolist())
        rope = read_rope(self, int(self.key(Keys.Rope.DIMENSION_COUNT, self.hp.head_dim)), self.neox_rope, factors)
        sections = self.gguf.arch_value(Keys.Rope.DIMENSION_SECTIONS) if self.multi_axis_rope else None
        if sections is None:
            return rope
        unrotated = text_unrotated_pairs(list(sections), rope.dim // 2, self.multi_axis_rope == "interleaved")
        return replace(rope, unrotated=unrotated)

    # -- layers ----------------------------------------------------------------------------
    def load_layer(self, i: int, device, dtype, weights: WeightBlock | None = None,
                   expert_slices: int = 1) -> DecoderLayer:
        t = BlockTensors(self.gguf, i, device, dtype, weights, expert_slices)
        layer = DecoderLayer(self.specs[i], self.layer_steps(self.specs[i], t))
        t.check_all_read()
        return layer

    def layer_steps(self, spec: LayerSpec, t: BlockTensors) -> list[Residual]:
        """Mixer then feed-forward, each with its pre-norm and (where present) post-norm."""
        eps = self.hp.eps
        attn_post = t(MT.ATTN_POST_NORM, required=False) if self.ffn_norm != MT.ATTN_POST_NORM else None
        return [Residual(t(MT.ATTN_NORM), self.mixer(spec, t), eps, attn_post),
                Residual(t(self.ffn_norm), self.ffn(spec, t), eps, t(MT.FFN_POST_NORM, required=False))]

    def mixer(self, spec: LayerSpec, t: BlockTensors) -> nn.Module:
        """The layer's token mixer; families with recurrent layers add theirs."""
        assert spec.mixer == "attention", spec
        return self.attention(spec.attention, t)

    def attention(self, spec: AttentionSpec, t: BlockTensors) -> Attention:
        return self.attention_class(self.attention_weights(spec, t), spec, self.hp.eps)

    def attention_weights(self, spec: AttentionSpec, t: BlockTensors) -> dict[str, torch.Tensor | None]:
        """Q, K, V (split from a fused attn_qkv where the file has one), O, and the optional biases
        and QK-norms."""
        if t.has(MT.ATTN_QKV):  # fused (the converter's --fuse-qkv): Q, K and V are row blocks of one tensor
            rows = qkv_rows(spec)
            w = dict(zip(("q", "k", "v"), t(MT.ATTN_QKV).split(rows)))
            if (bias := t(MT.ATTN_QKV, "bias", required=False)) is not None:
                w |= dict(zip(("q_bias", "k_bias", "v_bias"), bias.split(rows)))
        else:
            w = {"q": t(MT.ATTN_Q), "k": t(MT.ATTN_K), "v": t(MT.ATTN_V)}
        w["o"] = t(MT.ATTN_OUT)
        optional = {"q_bias": (MT.ATTN_Q, "bias"), "k_bias": (MT.ATTN_K, "bias"), "v_bias": (MT.ATTN_V, "bias"),
                    "o_bias": (MT.ATTN_OUT, "bias"), "q_norm": (MT.ATTN_Q_NORM, "weight"),
                    "k_norm": (MT.ATTN_K_NORM, "weight")}
        return w | {k: t(kind, suffix, required=False) for k, (kind, suffix) in optional.items() if k not in w}

    def ffn(self, spec: LayerSpec, t: BlockTensors) -> nn.Module:
        if spec.ffn == "moe":
            return self.moe(spec.index, t)
        return MLP(t(MT.FFN_UP), t(MT.FFN_DOWN), t(MT.FFN_GATE, required=False), self.activation,
                   t(MT.FFN_UP, "bias", required=False), t(MT.FFN_DOWN, "bias", required=False))

    def normalizes_expert_weights(self) -> bool:
        """Families that read expert_weights_norm renormalise their top-k weights where it is set;
        the others (softmax families) always."""
        if Keys.LLM.EXPERT_WEIGHTS_NORM in self.honours:
            return bool(self.key(Keys.LLM.EXPERT_WEIGHTS_NORM, False))
        return True

    def read_gating(self) -> str:
        """How router logits become expert weights: fixed per family (`expert_gating`), or read
        from expert_gating_func by the families that honour it."""
        return self.expert_gating

    def gating_in_file(self, default: str | None) -> str:
        """The routing function of a family that reads expert_gating_func (`default` where unset;
        None: llama.cpp stops on a file without one, and so do we)."""
        code = self.gguf.arch_value(Keys.LLM.EXPERT_GATING_FUNC)
        if code is None:
            return default or self.key(Keys.LLM.EXPERT_GATING_FUNC)
        names = {c: name for name, c in GATING_CODES.items()}
        if int(code) not in names:
            raise UserError(f"{self.gguf.path}: expert_gating_func {int(code)} is not computed by layercycle "
                            f"(softmax and sigmoid are)")
        return names[int(code)]

    def routing(self, i: int) -> Routing:
        return Routing(n_used=int(self.layer_key(Keys.LLM.EXPERT_USED_COUNT, i)), gating=self.expert_gating,
                       normalize=self.normalizes_expert_weights(),
                       scale=float(self.key(Keys.LLM.EXPERT_WEIGHTS_SCALE, 0.0)) or 1.0, **self.groups)

    def expert_groups(self) -> dict:
        """Group-limited routing, which llama.cpp applies for any architecture whose file sets
        more than one expert group."""
        groups = int(self.key(Keys.LLM.EXPERT_GROUP_COUNT, 0))
        if groups <= 1:
            return {}
        used, n_expert = int(self.key(Keys.LLM.EXPERT_GROUP_USED_COUNT, 0)), int(self.key(Keys.LLM.EXPERT_COUNT))
        if n_expert % groups or n_expert // groups < 2 or not 0 < used < groups:
            raise UserError(f"{self.gguf.path}: {n_expert} experts in {groups} groups, {used} of them used, is not "
                            f"a group-limited routing (equal groups of two experts or more, fewer used than there are)")
        return {"n_groups": groups, "n_groups_used": used}

    def moe(self, i: int, t: BlockTensors) -> MoE:
        shared = None
        if t.has(MT.FFN_UP_SHEXP):
            shared = MLP(t(MT.FFN_UP_SHEXP), t(MT.FFN_DOWN_SHEXP), t(MT.FFN_GATE_SHEXP, required=False),
                         self.activation)
        router = t(MT.FFN_GATE_INP)
        return MoE(router=router, experts=self.routed_experts(t), act=self.activation, routing=self.routing(i),
                   selection_bias=t(MT.FFN_EXP_PROBS_B, "bias", required=False),
                   shared=shared, shared_gate=t(MT.FFN_GATE_INP_SHEXP, required=False),
                   weight_before_experts=self.weight_before_experts)

    def routed_experts(self, t: BlockTensors) -> nn.Module:
        """The layer's routed experts: held with the window, or (t.expert_slices > 1) read a
        slice at a time while the layer runs."""
        fused = self.fused_gate_up_experts and t.has(MT.FFN_GATE_UP_EXP)  # the converter's --fuse-gate-up-exps
        if t.expert_slices > 1:
            names = expert_tensor_names(self.gguf, t.i)
            if not fused:
                names.pop("gate_up", None)
            t.read.update(names.values())
            return SlicedExperts(self.gguf, names, t.expert_slices, t.device, t.dtype, t.weights)
        if fused:
            gate, up = split_gate_up(t(MT.FFN_GATE_UP_EXP))
        else:
            up, gate = t(MT.FFN_UP_EXP), t(MT.FFN_GATE_EXP, required=False)
        return HeldExperts(up, t(MT.FFN_DOWN_EXP), gate)

    # -- embedding and head ----------------------------------------------------------------
    def embed(self, ids: torch.Tensor, device, dtype) -> torch.Tensor:
        """ids [B, T] -> hidden [B, T, hidden]; dequantizes only the rows that occur."""
        name = TENSOR_NAMES[MT.TOKEN_EMBD] + ".weight"
        info = self.gguf.tensors[name]
        unique, inverse = torch.unique(ids, return_inverse=True)
        rows = self.gguf.raw(name)[unique.numpy()]
        table = dequantize(rows, info.qtype, device, name, dtype)  # [U, hidden]
        x = table[inverse.to(device)]
        if self.embed_scale is not None:
            x = x * torch.tensor(self.embed_scale, dtype=dtype, device=device)
        return x

    def load_head(self, device, dtype) -> "Head":
        out = TENSOR_NAMES[MT.OUTPUT] + ".weight"
        if out not in self.gguf.tensors:  # tied embeddings
            out = TENSOR_NAMES[MT.TOKEN_EMBD] + ".weight"
        norm_name = TENSOR_NAMES[MT.OUTPUT_NORM] + ".weight"
        norm = read_tensor(self.gguf, norm_name, device, held_dtype(norm_name, dtype))
        return Head(norm, read_tensor(self.gguf, out, device, dtype), self.hp.eps, self.finish_logits)

    def finish_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """How the family's graph ends: float32 logits [N, S] of a vocabulary slice -> the logits
        scored (a family with logit soft-capping or scales applies them here)."""
        return logits


class Head(Weights):
    """Final norm + LM head: hidden [N, hidden] -> float32 logits [N, vocab], ended by the
    family's `finish` (DecoderArch.finish_logits; None: as they are)."""

    def __init__(self, norm: torch.Tensor, weight: torch.Tensor, eps: float, finish=None):
        super().__init__({"norm": norm, "weight": weight})
        self.eps, self.finish = eps, finish

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits(rms_norm(x.float(), self.norm, self.eps), self.weight)

    def logits(self, normed: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        # float32 logits, accumulated in float32 from 16-bit weights too (logits rounded to
        # bfloat16 before the log-sum-exp lie on a 0.125 grid at 16)
        z = F.linear(normed, weight.to(normed.dtype))
        return z if self.finish is None else self.finish(z)

    def logit_slices(self, x: torch.Tensor, width: int):
        """x [N, hidden] -> (first id, float32 logits [N, <= width]) per slice of the vocabulary,
        so that all N x vocab logits never exist at once. With 16-bit weights a slice's float32
        copy is at most WIDENED_SLICE_BYTES, which narrows the slices of a wide model."""
        normed = rms_norm(x.float(), self.norm, self.eps)                   # [N, hidden] float32
        if self.weight.dtype.itemsize < 4:
            width = min(width, max(1, WIDENED_SLICE_BYTES // (4 * self.weight.shape[1])))
        for start in range(0, self.weight.shape[0], width):
            yield start, self.logits(normed, self.weight[start:start + width])
