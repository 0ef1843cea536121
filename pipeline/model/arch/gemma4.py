"""gemma4 (Gemma 4): Gemma 3's layer (each block between a norm of its input and one of its
output) with

- attention at scale 1: Q and K RMS-normed per head with weights, V without; sliding layers with
  their own head size, RoPE width and base (rope.freq_base_swa, else 10000), global layers with
  "proportional" RoPE (`rope_freqs`, huge on the unrotated pairs) and, on the larger sizes, V
  taken from K's projection (no attn_v);
- K/V shared by the last `attention.shared_kv_layers` layers: a layer without K/V attends over
  those of the last layer before them of its kind (llama.cpp's layer_reuse_cb). A boundary
  between the source and the layers that share it carries the source's K and V beside the
  hidden state (`boundary_width`), so every window still reads one boundary and writes one;
- experts beside the dense MLP (26B-A4B): each with its own post-norm, their sum post-normed;
  the router over the RMS-normed stream scaled by ffn_gate_inp.scale / sqrt(hidden), softmax
  top-k renormalised, each expert's output scaled by ffn_down_exps.scale;
- per-layer embeddings (E2B, E4B): from the token ids, a slice of per_layer_token_embd plus a
  normed projection of the embedding, gated into each layer's output (`PerLayerInputs`, built
  per window from the token ids, as Embed does);
- a scalar on each layer's output (layer_output_scale), the final logit soft-cap.
"""
import functools
import math

import numpy as np
import torch
import torch.nn.functional as F
from gguf import MODEL_TENSOR as MT
from gguf import Keys

from ...errors import UserError
from ...gguf_io.dequant import dequantize
from ...gguf_io.ggml_types import QUANT_SIZES
from ..llama_cpp_numerics import kv_cached
from .blocks import Attention, AttentionSpec, Weights, rms_norm, wide
from .family import FLOAT32_TENSORS, LayerSpec
from .ffn import MLP, MoE, Routed, route
from .gemma3 import SWA_ROPE_BASE, Gemma3, gelu_tanh
from .loading import BlockTensors, read_tensor
from .modules import Layer
from .rope import RopeSpec, apply_rope


class Gemma4Attention(Attention):
    """Gemma 4's attention: x [B, T, hidden] -> (output [B, T, hidden], (K, V) [B, KV, T, D] each
    as it attended over). `shared`: the K and V of the layer this one reuses (None: its own)."""

    def forward(self, x: torch.Tensor, tables, shared=None):
        B, T, _ = x.shape
        w, s = self.w, self.spec
        cos, sin = tables.rope(s.rope)
        q = self.head_norm(F.linear(x, w["q"]).view(B, T, s.n_head, s.key_dim), w["q_norm"]).transpose(1, 2)
        q = apply_rope(q, cos, sin, s.rope)                                          # [B, H, T, D]
        if shared is None:
            k = F.linear(x, w["k"]).view(B, T, s.n_kv, s.key_dim)
            v = F.linear(x, w["v"]).view(B, T, s.n_kv, s.value_dim) if "v" in w else k   # diff: V from K's projection
            k = apply_rope(self.head_norm(k, w["k_norm"]).transpose(1, 2), cos, sin, s.rope)
            v = rms_norm(v, None, self.eps).transpose(1, 2)
            shared = kv_cached(k), kv_cached(v)                                      # [B, KV, T, D] each, as cached
        y = self.attend(q, *shared, tables).transpose(1, 2).reshape(B, T, s.n_head * s.value_dim)
        return F.linear(y, w["o"]), shared


class Gemma4MoE(MoE):
    """The experts beside Gemma 4's dense MLP: routed on the RMS-normed stream scaled by
    `router_scale` / sqrt(hidden); each expert's output scaled by `expert_scale` (folded into its
    routing weight, as transformers applies it)."""

    def __init__(self, router_scale: torch.Tensor, expert_scale: torch.Tensor, eps: float, **kw):
        super().__init__(**kw)
        self.register_buffer("router_scale", router_scale, persistent=False)
        self.register_buffer("expert_scale", expert_scale, persistent=False)
        self.eps = eps

    def route(self, flat: torch.Tensor, stream: torch.Tensor) -> Routed:
        # flat [N, hidden] the experts' input; stream [B, T, hidden] the router's (not the normed input)
        stream = stream.reshape(flat.shape)
        u = rms_norm(wide(stream), None, self.eps) * (1.0 / math.sqrt(flat.shape[-1])) * self.router_scale
        weights, experts = route(F.linear(u, self.router), self.routing)                   # [N, k] each
        return Routed.of(weights * self.expert_scale[experts], experts, self.experts.n_experts)


class Gemma4Layer(Layer):
    """llama.cpp's llm_build_gemma4, one layer. forward(x [B, T, width in], tables, state,
    token_input [B, T, per-layer width] or None) -> [B, T, width out]: a boundary's hidden state,
    then the K and V it carries for later layers, [B, T, KV x D] each, of the layers of
    `carried_in` / `carried_out` ((layer, its AttentionSpec), in layer order)."""

    def __init__(self, spec, eps, kv_from: int, carried_in: list, carried_out: list, **parts):
        super().__init__(spec, eps, **parts)
        self.kv_from, self.carried_in, self.carried_out = kv_from, carried_in, carried_out

    def forward(self, x: torch.Tensor, tables, state=None, token_input: torch.Tensor | None = None) -> torch.Tensor:
        h, carried = self.unpack(x)
        a, carried[self.spec.index] = self.attention(self.norm(h, self.attn_norm), tables, carried.get(self.kv_from))
        h = h + self.norm(a, self.attn_post_norm)
        f = self.mlp(self.norm(h, self.ffn_norm))
        if self.moe is not None:   # diff: experts beside the MLP, each post-normed, then their sum
            moe = self.moe(self.norm(h, self.ffn_pre_norm_2), h)
            f = self.norm(f, self.ffn_post_norm_1) + self.norm(moe, self.ffn_post_norm_2)
        h = h + self.norm(f, self.ffn_post_norm)
        if token_input is not None:  # diff: the per-layer embedding, gated by the stream
            g = gelu_tanh(F.linear(h, self.inp_gate)) * token_input                  # [B, T, per-layer width]
            h = h + self.norm(F.linear(g, self.proj), self.post_norm)
        if self.out_scale is not None:
            h = (h * self.out_scale).to(h.dtype)
        return self.pack(h, carried)

    def unpack(self, x: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """x [B, T, width] -> (hidden [B, T, hidden], {layer: (K, V) [B, KV, T, D] each})."""
        B, T, _ = x.shape
        widths = [a.n_kv * d for _, a in self.carried_in for d in (a.key_dim, a.value_dim)]
        h, *parts = x.split([x.shape[-1] - sum(widths), *widths], dim=-1)
        carried = {}
        for j, (i, a) in enumerate(self.carried_in):
            k, v = parts[2 * j:2 * j + 2]
            carried[i] = (k.view(B, T, a.n_kv, a.key_dim).transpose(1, 2),
                          v.view(B, T, a.n_kv, a.value_dim).transpose(1, 2))
        return h, carried

    def pack(self, h: torch.Tensor, carried: dict) -> torch.Tensor:
        B, T, _ = h.shape
        flat = [t.transpose(1, 2).reshape(B, T, -1) for i, _ in self.carried_out for t in carried[i]]
        return torch.cat([h, *flat], dim=-1) if flat else h


class PerLayerInputs(Weights):
    """Gemma 4's per-layer inputs of layers [first, last), from the token ids alone: ids [B, T] ->
    {layer: [B, T, width]}, (norm(proj(embedding) / sqrt(hidden)) + rows of per_layer_token_embd x
    sqrt(width)) / sqrt(2)."""

    def __init__(self, arch: "Gemma4", first: int, last: int, device, dtype):
        P = arch.per_layer_width
        name = "per_layer_model_proj.weight"     # this window's layers' rows only: [(last - first) P, hidden]
        proj = dequantize(arch.gguf.raw(name)[first * P:last * P], arch.gguf.tensors[name].qtype, device, name, dtype)
        norm = read_tensor(arch.gguf, "per_layer_proj_norm.weight", device, torch.promote_types(dtype, torch.float32))
        super().__init__({"proj": proj, "norm": norm})
        self.arch, self.first, self.last, self.device, self.dtype = arch, first, last, device, dtype

    def forward(self, ids: torch.Tensor) -> dict[int, torch.Tensor]:
        arch, P = self.arch, self.arch.per_layer_width
        e = arch.embed(ids, self.device, self.dtype)                                   # [B, T, hidden]
        unique, inverse = torch.unique(ids, return_inverse=True)
        rows = self.token_rows(unique.numpy())                                          # [U, layers, P]
        inverse = inverse.to(self.device)
        inputs = {}
        for k in range(self.last - self.first):   # a layer at a time: the same numbers in any window
            proj = F.linear(e, self.proj[k * P:(k + 1) * P]) * (1.0 / math.sqrt(arch.hp.hidden))     # [B, T, P]
            tok = rows[:, k][inverse] * math.sqrt(P)                                                # [B, T, P]
            inputs[self.first + k] = (rms_norm(proj, self.norm, arch.hp.eps) + tok) * (1.0 / math.sqrt(2.0))
        return inputs

    def token_rows(self, tokens: np.ndarray) -> torch.Tensor:
        """per_layer_token_embd's rows of `tokens`, this window's layers only where they fill whole
        quantization blocks (else the whole rows, sliced after): [U, last - first, width]."""
        gguf, P, name = self.arch.gguf, self.arch.per_layer_width, "per_layer_token_embd.weight"
        qtype = gguf.tensors[name].qtype
        block, type_size = QUANT_SIZES[qtype]
        a, b = self.first * P, self.last * P
        raw = gguf.raw(name)[tokens]                                                    # [U, row bytes]
        if a % block or b % block:
            rows = dequantize(raw, qtype, self.device, name, self.dtype).view(len(tokens), -1, P)
            return rows[:, self.first:self.last]
        window = raw[:, a // block * type_size:b // block * type_size]
        return dequantize(window, qtype, self.device, name, self.dtype).view(len(tokens), -1, P)


class Gemma4(Gemma3):
    fused_gate_up_experts = True
    # the router's input scale, each expert's output scale and the layer's output scalar stay float32
    float32_tensors = FLOAT32_TENSORS + ("ffn_gate_inp.scale", "ffn_down_exps.scale", "layer_output_scale.weight")
    honours = Gemma3.honours | {Keys.Attention.SHARED_KV_LAYERS}

    def __init__(self, gguf):
        super().__init__(gguf)
        self.per_layer_width = int(self.key(Keys.LLM.EMBD_LENGTH_PER_LAYER_INP, 0))
        self.takes_token_ids = self.per_layer_width > 0

    @functools.cached_property
    def kv_sources(self) -> list[int]:
        """The layer whose K and V each layer attends over: its own, or, past the layers with K/V,
        the last of them of its kind (llama.cpp's layer_reuse_cb: the last but one for a sliding
        layer), which must have the same heads."""
        own = self.hp.n_layers - int(self.key(Keys.Attention.SHARED_KV_LAYERS, 0))
        sources = []
        for i, spec in enumerate(self.specs):
            source = i if i < own else own - (2 if self.is_sliding(i) else 1)
            theirs = self.specs[source].attention if source >= 0 else None
            if theirs is None or self.is_sliding(source) != self.is_sliding(i) or (
                    (theirs.n_kv, theirs.key_dim, theirs.value_dim) != (spec.attention.n_kv, spec.attention.key_dim,
                                                                        spec.attention.value_dim)):
                raise UserError(f"{self.gguf.path}: layer {i} would share the K/V of layer {source}, which is not "
                                f"a layer of its kind with the same heads")
            sources.append(source)
        return sources

    def attention_spec(self, i: int) -> AttentionSpec:
        spec = super().attention_spec(i)
        if not self.is_sliding(i):   # proportional RoPE: rope_freqs of the file (trunk_rope)
            return spec
        size = int(self.key(Keys.Attention.KEY_LENGTH_SWA, self.hp.head_dim))
        rope = RopeSpec(int(self.key(Keys.Rope.DIMENSION_COUNT_SWA, spec.rope.dim)),
                        float(self.key(Keys.Rope.FREQ_BASE_SWA, SWA_ROPE_BASE)), neox=True)
        return AttentionSpec(spec.n_head, spec.n_kv, size, int(self.key(Keys.Attention.VALUE_LENGTH_SWA, size)),
                             spec.scale, rope, span=spec.span)

    def attention_scale(self) -> float:
        return 1.0

    def own_projections(self, i: int) -> tuple:
        """Q always; K on a layer with its own K/V; V never required (K's projection stands in)."""
        return (MT.ATTN_Q, MT.ATTN_K) if self.kv_sources[i] == i else (MT.ATTN_Q,)

    # -- what a boundary carries ---------------------------------------------------------------
    def carried(self, cut: int) -> list[tuple[int, AttentionSpec]]:
        """(layer, its AttentionSpec) of each K/V computed before `cut` and attended over after it."""
        sources = sorted({s for i, s in enumerate(self.kv_sources) if i >= cut and s < cut})
        return [(s, self.specs[s].attention) for s in sources]

    def boundary_width(self, cut: int) -> int:
        return self.hp.hidden + sum(a.n_kv * (a.key_dim + a.value_dim) for _, a in self.carried(cut))

    def token_inputs(self, first: int, last: int, device, dtype) -> PerLayerInputs | None:
        return PerLayerInputs(self, first, last, device, dtype) if self.takes_token_ids else None

    # -- the layer ------------------------------------------------------------------------------
    def layer(self, spec: LayerSpec, t: BlockTensors) -> Gemma4Layer:
        i, a = spec.index, spec.attention
        w = {"q": t(MT.ATTN_Q), "o": t(MT.ATTN_OUT), "q_norm": t(MT.ATTN_Q_NORM)}
        if self.kv_sources[i] == i:
            w |= {"k": t(MT.ATTN_K), "k_norm": t(MT.ATTN_K_NORM), "v": t(MT.ATTN_V, required=False)}
        moe, moe_norms = None, {}
        if spec.ffn == "moe":
            moe = Gemma4MoE(router_scale=t(MT.FFN_GATE_INP, "scale"), expert_scale=t(MT.FFN_DOWN_EXP, "scale"),
                            router=t(MT.FFN_GATE_INP), experts=self.routed_experts(t), act=self.activation,
                            routing=self.routing(i), eps=self.hp.eps)
            moe_norms = {"ffn_post_norm_1": t(MT.FFN_POST_NORM_1), "ffn_pre_norm_2": t(MT.FFN_PRE_NORM_2),
                         "ffn_post_norm_2": t(MT.FFN_POST_NORM_2)}
        ple = {}
        if self.per_layer_width:
            ple = {"inp_gate": t(MT.PER_LAYER_INP_GATE), "proj": t(MT.PER_LAYER_PROJ),
                   "post_norm": t(MT.PER_LAYER_POST_NORM)}
        return Gemma4Layer(spec, self.hp.eps, self.kv_sources[i], self.carried(i), self.carried(i + 1),
                           attn_norm=t(MT.ATTN_NORM), attention=Gemma4Attention(w, a, self.hp.eps),
                           attn_post_norm=t(MT.ATTN_POST_NORM), ffn_norm=t(MT.FFN_NORM),
                           mlp=MLP(t(MT.FFN_UP), t(MT.FFN_DOWN), t(MT.FFN_GATE), self.activation),
                           ffn_post_norm=t(MT.FFN_POST_NORM), moe=moe, **moe_norms, **ple,
                           out_scale=t(MT.LAYER_OUT_SCALE, required=False))

