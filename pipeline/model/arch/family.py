"""A decoder-only architecture over one GGUF file, its metadata read once: each layer's facts
(which mixer and feed-forward block, heads, head sizes, attention span, RoPE) into a `LayerSpec`,
the settings it computes and refuses (audit.py), what it holds in float32 and the activations it
keeps per token (asked by the weight block and the preflight), and how a layer, the embedding
and the head are built. A layer is the family's `layer`: its parts, read from the file, in a
module whose forward is the family's graph (modules.py). Subclasses (one module per family)
state what differs. Weights are read and dequantized only when a layer, the embedding rows or
the head are asked for.
"""
import functools
import math
import re
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F
from gguf import MODEL_TENSOR, TENSOR_NAMES, GGMLQuantizationType, Keys
from torch import nn

from ...errors import UserError
from ...gguf_io.dequant import dequantize
from ...gguf_io.reader import GGUFIndex
from ..weight_block import WeightBlock
from .audit import GATING_CODES, NEUTRAL, close_to, equals, never, refuse_settings_not_computed
from .blocks import Attention, AttentionSpec, blockwise_score_bytes, rms_norm
from .experts import HeldExperts, SlicedExperts, expert_tensor_names, split_gate_up
from .ffn import MLP, MoE, Routing
from .loading import BlockTensors, ShapeTensors, read_tensor
from .modules import Head, Layer, PreNormLayer
from .rope import RopeSpec, read_rope, text_unrotated_pairs
from .shapes import check_shapes, qkv_rows

MT = MODEL_TENSOR


@dataclass(frozen=True)
class LayerSpec:
    """What one layer computes, read from the metadata once."""
    index: int
    mixer: str                                # "attention", "mamba2", "delta_net", "shortconv",
    #                                           "attention+mamba2" (side by side), "linear" (one
    #                                           map in attention's place); "": none
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


# held in float32 (or wider) whatever the compute dtype, by every family: norm weights (Gemma's
# stored 1 + w too), routers with their biases, and selection biases; what reads them computes in
# float32, so rounding them to 16 bits first would lose bits that are never recovered
FLOAT32_TENSORS = ("_norm.weight", "ffn_gate_inp.weight", "ffn_gate_inp.bias", "exp_probs_b.bias")
KERNEL_WORKSPACE_BYTES = 8 * 2 ** 20   # a forward's own scratch at any length (GEMM packing, SDPA's blocks)
HC_COUNT = "{arch}.hyper_connection.count"
RECURRENT_LAYERS = getattr(Keys.Attention, "RECURRENT_LAYERS", "{arch}.attention.recurrent_layers")
COMPRESS_RATIOS = "{arch}.attention.compress_ratios"   # per layer: keys per compressed block (0: none)


class DecoderArch:
    neox_rope = False           # llama GGUFs store Q/K permuted for consecutive-pair RoPE
    activation = staticmethod(F.silu)
    embed_scale: float | None = None
    expert_gating = "softmax"   # how router logits become expert weights (llama.cpp fixes it per family)
    honours: frozenset[str] = frozenset()   # keys of audit.NEUTRAL the family computes (the audit's only)
    fused_gate_up_experts = False           # llama.cpp loads ffn_gate_up_exps for this family
    fused_gate_up_mlp = False               # the dense MLP's ffn_up holds the gate's rows, then the up's
    swa_period = 0                          # families with sliding-window layers: the last of each period is global
    swa_dense_first = False                 # True: the first of each period is the global one instead
    multi_axis_rope = ""                    # "sections" or "interleaved": the family reads rope.dimension_sections
    weight_before_experts = False           # the routing weight scales the expert's input, not its output
    float32_tensors = FLOAT32_TENSORS       # name endings of the tensors held in float32 (or wider)
    own_head_required = False               # llama.cpp's loader requires output.weight (no tied head)
    # where llama.cpp's loader for the family parts from the base (a block's tensors as "blk.{bid}.NAME",
    # for every block): the tensors it requires that the base takes where present, and those its graph
    # never computes (its loader refuses them, or loads them unused) that the base would compute or pass
    # over; a file without one of the first or with one of the second is refused when it is opened
    required_tensors: tuple[str, ...] = ()
    uncomputed_tensors: tuple[str, ...] = ()
    required_keys: tuple[str, ...] = ()     # keys without which llama.cpp's loader stops (beyond every family's)
    blockwise_scores = False                # its attention forms the scores outside SDPA (blocks.BlockwiseAttention)
    norm = staticmethod(rms_norm)           # the final norm's (the layers' own are their Layer's)
    output_norm = MT.OUTPUT_NORM            # the final norm's tensor
    numerics = 1                            # raised by a change of this family's math (pipeline/numerics.py)
    takes_token_ids = False                 # its layers take inputs from the token ids (token_inputs)
    sliceable_experts = True                # a layer's routed experts may run a slice at a time (model/sliced.py)
    # its layers compute packed rows (a choice task's sequences sharing their first tokens, several tasks in a
    # row: SequencePlan.layout) through Tables' positions and mask; False: a row per sequence
    packs_sequences = True
    moe_block = MoE                         # the module of a layer's experts (ffn.MoE, or the family's)
    # the attention tensors beside Q, K, V and O that the family's llama.cpp loader may take (any
    # other the file holds is refused: BlockTensors.check_all_read)
    optional_attention = ("q_bias", "k_bias", "v_bias", "o_bias", "q_norm", "k_norm")
    scan_floats = 9                         # a recurrent mixer's activations per token, in its widest projections

    def __init__(self, gguf: GGUFIndex):
        self.gguf = gguf
        for template in self.required_keys:
            self.key(template)
        self.hp = self.read_hparams()
        self.expert_gating = self.read_gating()
        refuse_settings_not_computed(self)
        self.groups = self.expert_groups()
        self.specs = [self.layer_spec(i) for i in range(self.hp.n_layers)]
        self.check_loader_tensors()
        check_shapes(self)
        if self.own_head_required and "output.weight" not in gguf.tensors:   # llama.cpp's loader: no tied head
            raise UserError(f"{gguf.path}: missing tensor output.weight (a {gguf.architecture} file's LM head)")

    def settings_not_computed(self) -> dict:
        """The settings this family does not compute, each with the test of a value that
        leaves its math unchanged (audit.py)."""
        gating = GATING_CODES.get(self.expert_gating)   # None: llama.cpp fixes one the key cannot name
        neutral = {**NEUTRAL, Keys.Attention.SCALE: close_to(self.attention_scale()),
                   Keys.LLM.EXPERT_GATING_FUNC: equals(gating) if gating is not None else never}
        if self.multi_axis_rope:
            del neutral[Keys.Rope.DIMENSION_SECTIONS]
        return {key: test for key, test in neutral.items() if key not in self.honours}

    def check_loader_tensors(self) -> None:
        """The file against `required_tensors` and `uncomputed_tensors`, one line naming the first
        tensor missing or not computed."""
        for template in self.required_tensors:
            for i in range(self.hp.n_layers):
                if (name := template.format(bid=i)) not in self.gguf.tensors:
                    raise UserError(f"{self.gguf.path}: missing tensor {name}")
        for name in self.gguf.tensors if self.uncomputed_tensors else ():
            if re.sub(r"^blk\.\d+\.", "blk.{bid}.", name) in self.uncomputed_tensors:
                raise UserError(f"{self.gguf.path}: tensor {name} is not part of llama.cpp's {self.gguf.architecture} "
                                f"graph; layercycle does not guess what it means")

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
        total = int(self.key(Keys.LLM.BLOCK_COUNT))
        if total > len(self.gguf.tensors):   # a block holds a tensor at least: a damaged count, refused before a loop
            present = self.gguf.blocks()
            missing = next(i for i in range(total) if i not in present)
            raise UserError(f"{self.gguf.path}: block_count is {total} but block {missing} has none")
        n_layers = total - int(self.key(Keys.LLM.NEXTN_PREDICT_LAYERS, 0))
        head_dim = int(self.key(Keys.Attention.KEY_LENGTH, hidden // max(n_head, 1)))
        context = int(self.key(Keys.LLM.CONTEXT_LENGTH))
        for template, value in ((Keys.LLM.EMBEDDING_LENGTH, hidden), (Keys.Attention.KEY_LENGTH, head_dim),
                                (Keys.LLM.CONTEXT_LENGTH, context)):
            if value < 1:
                raise UserError(f"{self.gguf.path}: {template.format(arch=self.gguf.architecture)} is {value}")
        return HParams(n_layers=n_layers, hidden=hidden, n_head=n_head, n_kv=n_kv, head_dim=head_dim,
                       eps=self.rms_eps(), context_length=context, vocab=int(vocab))

    def rms_eps(self) -> float:
        return float(self.key(Keys.Attention.LAYERNORM_RMS_EPS))

    def has_tensor(self, i: int, kind: MODEL_TENSOR, suffix: str = "weight") -> bool:
        return f"{TENSOR_NAMES[kind].format(bid=i)}.{suffix}" in self.gguf.tensors

    # -- the spec of each layer ------------------------------------------------------------
    def layer_spec(self, i: int) -> LayerSpec:
        """Attention, then experts where the block has a router, else the dense MLP."""
        return LayerSpec(i, "attention", self.ffn_kind(i), self.attention_spec(i))

    def ffn_kind(self, i: int) -> str:
        """Experts where the block has a router, else the dense MLP."""
        return "moe" if self.has_tensor(i, MT.FFN_GATE_INP) else "mlp"

    def dense_then_experts(self, i: int) -> str:
        """The ffn_kind of families that read leading_dense_block_count: dense below it, experts
        from it on, as llama.cpp's loaders."""
        return "mlp" if i < int(self.key(Keys.LLM.LEADING_DENSE_BLOCK_COUNT, 0)) else "moe"

    def attention_spec(self, i: int) -> AttentionSpec:
        n_head = int(self.layer_key(Keys.Attention.HEAD_COUNT, i))
        return AttentionSpec(n_head=n_head, n_kv=int(self.layer_key(Keys.Attention.HEAD_COUNT_KV, i, n_head)),
                             key_dim=self.hp.head_dim,
                             value_dim=int(self.key(Keys.Attention.VALUE_LENGTH, self.hp.head_dim)),
                             scale=self.attention_scale(), rope=self.trunk_rope)

    def own_projections(self, i: int) -> tuple[MODEL_TENSOR, ...]:
        """The attention projections layer i must have (a fused attn_qkv stands in for them)."""
        return MT.ATTN_Q, MT.ATTN_K, MT.ATTN_V

    def yarn_mscales(self) -> tuple[float, float]:
        """(mscale, mscale_all_dim) of llama.cpp's YaRN attention factor; mscale_all_dim 0: the
        family reads no rope.scaling.yarn_log_mul (a file that sets one is refused)."""
        return 1.0, 0.0

    def yarn_betas(self) -> dict[str, float]:
        """The YaRN correction dims' betas (and extension factor) the family reads from the file (Yarn's
        fields); none: llama.cpp's defaults, which a file of such a family must state if it states
        them (rope.py)."""
        return {}

    def sliding(self, spec: AttentionSpec) -> AttentionSpec:
        """A sliding layer's spec: the file's window, the file's sliding RoPE base (else the trunk's)."""
        rope = spec.rope and replace(spec.rope, base=float(self.key(Keys.Rope.FREQ_BASE_SWA, spec.rope.base)))
        return replace(spec, span=int(self.key(Keys.Attention.SLIDING_WINDOW)), rope=rope)

    def is_sliding(self, i: int) -> bool:
        """llama.cpp's load_swa_pattern: a per-layer array, or a period (from the file or the
        family's `swa_period`) whose last layer (first: `swa_dense_first`) attends globally; period
        0: every layer slides."""
        pattern = self.gguf.arch_value(Keys.Attention.SLIDING_WINDOW_PATTERN)
        if isinstance(pattern, np.ndarray):
            return bool(pattern[i])
        period = int(pattern) if pattern is not None else self.swa_period
        return period == 0 or i % period != (0 if self.swa_dense_first else period - 1)

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

    # -- what a window holds ---------------------------------------------------------------
    def held_dtype(self, name: str, dtype: torch.dtype) -> torch.dtype:
        """The dtype a window holds tensor `name` in when it computes in `dtype`."""
        return torch.promote_types(dtype, torch.float32) if name.endswith(self.float32_tensors) else dtype

    def activation_floats(self, i: int) -> int:
        """Float32 values per token that layer i's forward holds at its peak, from what the layer has
        (measured on the CPU for dense, MoE, attention-only and Mamba2 layers: tests/test_memory.py):
        the residual stream, 2.5 x hidden; an attention or a short convolution, twice its widest
        projection, and twice more where its K is as wide as its Q (no grouped heads); a dense or
        shared MLP, twice its width; routed experts, 2 x hidden and 8 per expert (router logits,
        probabilities, the sort), and twice their width where a gated unit clamps them; a recurrent
        mixer, `scan_floats` x its widest projection (9: with its blockwise scan; a family whose scan
        holds a block of its own counts that in activation_bytes); twice what the boundaries before
        and after it carry beside the hidden state (boundary_width)."""
        rows: dict[str, int] = {}
        for t in self.gguf.layer_tensors(i):
            kind = t.name.split(".")[2]
            if len(t.shape) >= 2 and t.qtype != GGMLQuantizationType.I32:   # not a table of ids (hash routing)
                group = ("ssm" if kind.startswith("ssm_") else "attn" if kind.startswith(("attn_", "shortconv")) else
                         "experts" if kind.endswith("_exps") else "router" if kind == "ffn_gate_inp" else
                         "mlp" if kind.startswith("ffn_") else "other")
                rows[group] = max(rows.get(group, 0), t.shape[-2])
                rows[kind] = t.shape[-2]
        floats = 2.5 * self.hp.hidden + 2 * rows.get("attn", 0) + 2 * rows.get("mlp", 0)
        if rows.get("attn_k", 0) >= rows.get("attn_q", 1):   # K and V as wide as Q beside its temporaries
            floats += 2 * rows["attn"]                         # (no grouped heads; measured: OLMoE)
        if "router" in rows:
            floats += 2 * self.hp.hidden + 8 * rows["router"]
        if "experts" in rows and self.gated_unit(i) is not None:   # a clamped SwiGLU's copies of an expert's
            floats += 2 * rows["experts"]                          # gate and up, out of place (measured: gpt-oss)
        if "ssm" in rows:
            floats += self.scan_floats * max(rows["ssm"], rows.get("attn", 0))
        # what the boundaries around the layer carry beside the hidden state, in and out
        floats += 2 * (self.boundary_width(i) + self.boundary_width(i + 1) - 2 * self.hp.hidden)
        return int(floats)

    def activation_bytes(self, batch: int, ctx: int, n_head: int, device: str = "cpu") -> int:
        """What a window's forward holds besides its weights for `batch` sequences of `ctx` tokens on
        `device`: the widest layer's activations per token (activation_floats), the kernels'
        workspace, and what attention keeps beyond them (attention_score_bytes)."""
        per_token = max(self.activation_floats(i) for i in range(self.hp.n_layers))
        return KERNEL_WORKSPACE_BYTES + 4 * batch * ctx * per_token + self.attention_score_bytes(
            batch, ctx, n_head, device)

    def attention_score_bytes(self, batch: int, ctx: int, n_head: int, device: str) -> int:
        """What attention holds beyond the counted activations. SDPA's kernels on the CPU (causal,
        sliding window and chunked) and its flash and memory-efficient ones on CUDA never hold the
        [batch, heads, ctx, ctx] scores; a boolean mask is kept (masked_layers); on CUDA a mask with
        grouped-query heads sends SDPA to its math kernel, which holds the scores, the masked scores
        and their softmax, three float32 score tensors (a value head size other than the key's does
        not: blocks.sdpa pads it). A family whose attention forms its scores itself
        (`blockwise_scores`) holds a block of queries' float32 scores on every device."""
        masked = self.masked_layers(ctx)
        extra = ctx * ctx if masked else 0
        if self.blockwise_scores:
            extra += blockwise_score_bytes(batch, ctx, n_head)
        elif device.startswith("cuda") and any(a.n_kv != a.n_head for a in masked):
            extra += 3 * 4 * batch * n_head * ctx * ctx
        return extra

    def qk_norm_shapes(self, a: AttentionSpec) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The shapes of a layer's attn_q_norm and attn_k_norm weights: over all heads at once, or
        one key_length weight that every head shares."""
        if a.qk_norm_across_heads:
            return (a.n_head * a.key_dim,), (a.n_kv * a.key_dim,)
        return (a.key_dim,), (a.key_dim,)

    def masked_layers(self, ctx: int) -> list[AttentionSpec]:
        """The attention layers whose window or chunk is shorter than ctx: each needs a boolean
        [ctx, ctx] mask."""
        specs = [spec.attention for spec in self.specs if spec.attention]
        return [a for a in specs if (a.span or ctx) < ctx or (a.chunk or ctx) < ctx]

    def boundary_width(self, cut: int) -> int:
        """Values per token of the boundary before layer `cut`: the hidden state, and whatever
        the family carries across the cut beside it."""
        return self.hp.hidden

    def token_inputs(self, first: int, last: int, device, dtype) -> nn.Module | None:
        """What layers [first, last) take from the token ids besides the boundary: a module ids
        [B, T] -> {layer: its input [B, T, width]}, for the layers that take one; None: nothing."""
        return None

    # -- layers ----------------------------------------------------------------------------
    def load_layer(self, i: int, device, dtype, weights: WeightBlock | None = None,
                   expert_slices: int = 1) -> Layer:
        t = BlockTensors(self.gguf, i, device, dtype, self.held_dtype, weights, expert_slices)
        layer = self.layer(self.specs[i], t)
        t.check_all_read()
        return layer

    def layer_shapes(self, i: int, dtype: torch.dtype) -> Layer:
        """Layer i built on the meta device: its modules, settings and tensor shapes, no byte read."""
        t = ShapeTensors(self.gguf, i, "meta", dtype, self.held_dtype)
        layer = self.layer(self.specs[i], t)
        t.check_all_read()
        return layer

    def layer(self, spec: LayerSpec, t: BlockTensors) -> Layer:
        """llama's layer (modules.PreNormLayer): the mixer behind attn_norm, the feed-forward
        block behind ffn_norm."""
        return PreNormLayer(spec, self.hp.eps, attn_norm=t(MT.ATTN_NORM), mixer=self.mixer(spec, t),
                            ffn_norm=t(MT.FFN_NORM), ffn=self.ffn(spec, t))

    def mixer(self, spec: LayerSpec, t: BlockTensors) -> nn.Module:
        """The layer's token mixer; families with recurrent layers add theirs."""
        assert spec.mixer == "attention", spec
        return self.attention(spec.attention, t)

    def attention(self, spec: AttentionSpec, t: BlockTensors) -> Attention:
        return Attention(self.attention_weights(spec, t), spec, self.hp.eps)

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
        return w | {k: t(kind, suffix, required=False) for k, (kind, suffix) in optional.items()
                    if k not in w and k in self.optional_attention}

    def ffn(self, spec: LayerSpec, t: BlockTensors) -> nn.Module:
        if spec.ffn == "moe":
            return self.moe(spec.index, t)
        glu = self.gated_unit(spec.index, shared=True)
        if self.fused_gate_up_mlp:
            gate, up = t(MT.FFN_UP).chunk(2, dim=0)     # [2 ff, hidden], the gate's rows first
            return MLP(up, t(MT.FFN_DOWN), gate, self.activation, glu=glu)
        return MLP(t(MT.FFN_UP), t(MT.FFN_DOWN), t(MT.FFN_GATE, required=False), self.activation,
                   t(MT.FFN_UP, "bias", required=False), t(MT.FFN_DOWN, "bias", required=False), glu=glu)

    def gated_unit(self, i: int, shared: bool = False):
        """The gated unit of layer i's routed experts (`shared`: of its dense or shared MLP) where it
        is not act(gate) * up; None: it is."""
        return None

    def expert_width(self) -> int:
        """The routed experts' input and output width: the hidden size (a latent MoE's its own)."""
        return self.hp.hidden

    def normalizes_expert_weights(self) -> bool:
        """Whether the top-k weights are renormalised: always by the softmax families; where the
        file's expert_weights_norm says by the families that read it (weights_norm_in_file)."""
        return True

    def weights_norm_in_file(self) -> bool:
        return bool(self.key(Keys.LLM.EXPERT_WEIGHTS_NORM, False))

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
                            f"(softmax, sigmoid and sqrt-softplus are)")
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
                         self.activation, glu=self.gated_unit(i, shared=True))
        router = t(MT.FFN_GATE_INP)
        return self.moe_block(router=router, experts=self.routed_experts(t), act=self.activation,
                              routing=self.routing(i), selection_bias=t(MT.FFN_EXP_PROBS_B, "bias", required=False),
                              shared=shared, shared_gate=t(MT.FFN_GATE_INP_SHEXP, required=False),
                              glu=self.gated_unit(i), weight_before_experts=self.weight_before_experts)

    def routed_experts(self, t: BlockTensors) -> nn.Module:
        """The layer's routed experts: held with the window, or (t.expert_slices > 1) read a
        slice at a time while the layer runs."""
        fused = self.fused_gate_up_experts and t.has(MT.FFN_GATE_UP_EXP)  # the converter's --fuse-gate-up-exps
        if t.expert_slices > 1:
            names = expert_tensor_names(self.gguf, t.i)
            if not fused:
                names.pop("gate_up", None)
            t.read.update(names.values())
            return SlicedExperts(self.gguf, names, t.expert_slices, t.device, t.dtype, t.weights, t.held_dtype)
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

    def output_norm_shape(self) -> tuple[str, tuple[int, ...], str]:
        """The final norm's tensor, its shape, and why (shapes.check_shapes)."""
        return TENSOR_NAMES[self.output_norm] + ".weight", (self.hp.hidden,), "embedding_length"

    def load_head(self, device, dtype) -> "Head":
        out = TENSOR_NAMES[MT.OUTPUT] + ".weight"
        if out not in self.gguf.tensors:  # tied embeddings
            out = TENSOR_NAMES[MT.TOKEN_EMBD] + ".weight"
        norm_name = TENSOR_NAMES[self.output_norm] + ".weight"
        norm = read_tensor(self.gguf, norm_name, device, self.held_dtype(norm_name, dtype))
        return Head(norm, read_tensor(self.gguf, out, device, dtype), self.hp.eps, self.finish_logits, self.norm)

    def finish_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """How the family's graph ends: float32 logits [N, S] of a vocabulary slice -> the logits
        scored (a family with logit soft-capping or scales applies them here)."""
        return logits


class DenseThenSigmoidExperts:
    """A family whose loader reads leading_dense_block_count, expert_gating_func (sigmoid where the
    file names none) and expert_weights_norm: dense blocks, then experts routed so (mixed in
    before DecoderArch)."""
    honours = frozenset({Keys.LLM.EXPERT_WEIGHTS_NORM, Keys.LLM.EXPERT_WEIGHTS_SCALE, Keys.LLM.EXPERT_GATING_FUNC,
                         Keys.LLM.LEADING_DENSE_BLOCK_COUNT})

    def read_gating(self) -> str:
        return self.gating_in_file("sigmoid")

    def normalizes_expert_weights(self) -> bool:
        return self.weights_norm_in_file()

    def ffn_kind(self, i: int) -> str:
        return self.dense_then_experts(i)


class AttentionEveryNth:
    """A hybrid whose loader marks its recurrent layers by attention.recurrent_layers (one flag a
    layer, or one for all), else by full_attention_interval (`full_attention_interval` where the file
    names neither): every n-th layer attends, the others recur (mixed in before DecoderArch)."""
    full_attention_interval = 4   # llama.cpp's default for the family

    def is_recurrent(self, i: int) -> bool:
        flags = self.gguf.arch_value(RECURRENT_LAYERS)
        if isinstance(flags, np.ndarray):
            if len(flags) != int(self.key(Keys.LLM.BLOCK_COUNT)):   # llama.cpp's loader refuses it
                raise UserError(f"{self.gguf.path}: {RECURRENT_LAYERS.format(arch=self.gguf.architecture)} has "
                                f"{len(flags)} flags for block_count {int(self.key(Keys.LLM.BLOCK_COUNT))}")
            return bool(flags[i])
        if flags is not None:
            return bool(flags)
        interval = int(self.key(Keys.LLM.FULL_ATTENTION_INTERVAL, self.full_attention_interval))
        if interval < 1:
            raise UserError(f"{self.gguf.path}: {Keys.LLM.FULL_ATTENTION_INTERVAL.format(arch=self.gguf.architecture)} "
                            f"is {interval}")
        return (i + 1) % interval != 0


class HyperConnections:
    """A family whose residual is `hyper_connection.count` streams (mixed in before DecoderArch): a
    boundary after layer 0 holds them side by side; the embedding, before layer 0, is one."""

    @functools.cached_property
    def count(self) -> int:
        """The residual streams."""
        count = int(self.key(HC_COUNT))
        if count < 2:
            raise UserError(f"{self.gguf.path}: {HC_COUNT.format(arch=self.gguf.architecture)} is {count}; "
                            f"hyper-connections need two streams or more")
        return count

    def boundary_width(self, cut: int) -> int:
        return self.hp.hidden if cut == 0 else self.count * self.hp.hidden
