"""glm5-next (GLM-5.3-Flash), as llama.cpp's graph computes it (src/models/glm5-next.cpp):

- hyper-connections: DeepSeek-V4's four streams mixed by Sinkhorn (deepseek4.SinkhornMixer) before
  and after each block; the head collapses the streams by their mean, then output_norm;
- KDA on the layers whose head_count_kv is 0: kimi-linear's, the decay the safe gate where
  kda.gate_lower_bound is set (lower_bound sigmoid(exp(A_log) (f_b(f_a x) + dt_bias))), the output
  gate low-rank (g_b(g_a x));
- latent attention without RoPE on the others, over the keys a k-pool indexer selects: each complete
  pool of `indexer.kpool` keys (from the sequence's start) pooled into one key, a softmax over the
  pool per channel of indexer_compressor_gate x + ape weighting the LayerNorm'd indexer keys; each
  query scores the pools that end at or before it (deepseek32's score: sum over its heads of
  w_h relu(q_h . k) / sqrt(heads x head size)), attends to every key of its top top_k / kpool pools
  (ggml's heap breaking ties) and, where kpool_select_tail, to the keys of its own incomplete pool.
  Layers marked shared in attention.indexer.types reuse the selection of the last full layer
  before them, KDA layers between, carried in the boundaries (glm_dsa.pack_selection);
- dense SwiGLU blocks, then sigmoid experts (the file's gating function where set) with a selection
  bias beside the shared experts, every SwiGLU under ggml's swiglu_clamp (deepseek4's limits).
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
from .blocks import layer_norm, wide
from .deepseek2 import Deepseek2
from .deepseek4 import HC_EPS, HC_SINKHORN, Deepseek4, SinkhornMixer, write_back
from .family import HC_COUNT, HyperConnections, LayerSpec
from .glm_dsa import SharedSelectionAttention, pack_selection, unpack_selection
from .hy_v4 import HyV4Layer
from .kimi_k3 import KimiK3, KimiK3DeltaAttention
from .kimi_linear import KimiDeltaAttention, KimiLinear
from .loading import BlockTensors, read_tensor
from .modules import StreamsHead

KPOOL = "{arch}.attention.indexer.kpool"
KPOOL_SELECT_TAIL = "{arch}.attention.indexer.kpool_select_tail"
INDEXER_TYPES = "{arch}.attention.indexer.types"
REQUIRED_KEYS = (Keys.Attention.KEY_LENGTH_MLA, Keys.Attention.VALUE_LENGTH_MLA, Keys.Attention.Q_LORA_RANK,
                 Keys.Attention.KV_LORA_RANK, Keys.SSM.CONV_KERNEL, Keys.KDA.HEAD_DIM,
                 Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, Keys.LLM.EXPERT_SHARED_COUNT,
                 Keys.Attention.Indexer.HEAD_COUNT, Keys.Attention.Indexer.KEY_LENGTH, Keys.Attention.Indexer.TOP_K,
                 KPOOL, HC_COUNT, HC_SINKHORN, HC_EPS)


class LowRankSafeGateDeltaAttention(KimiK3DeltaAttention):
    """Kimi Delta Attention with kimi-k3's decay and kimi-linear's low-rank output gate."""

    output_gate = KimiDeltaAttention.output_gate


class KPoolAttention(SharedSelectionAttention):
    """Latent attention over the keys of the pools a k-pool indexer picks and the query's own
    incomplete pool, or over a shared layer's given selection: (x [B, T, hidden], selected [B, T, T]
    bool or None) -> (output, selected)."""

    def __init__(self, w, spec, eps: float, kv_rank: int, n_index_head: int, index_dim: int, top_k: int,
                 kpool: int, tail: bool, norm_eps: float):
        super().__init__(w, spec, eps, kv_rank, n_index_head, index_dim, top_k, None)
        self.kpool, self.tail, self.norm_eps = kpool, tail, norm_eps

    def describe(self) -> str:
        return f"pools of {self.kpool}, " + super().describe()

    def select(self, x: torch.Tensor, q_a: torch.Tensor, tables) -> torch.Tensor:
        """The keys each query attends to, [B, T queries, T keys] bool."""
        B, T, _ = x.shape
        w, H, D, r = self.w, self.n_index_head, self.index_dim, self.kpool
        x, q_a = x.float(), q_a.float()   # float32 whatever the compute dtype: 16 bits would move the top-k
        q = F.linear(q_a, w["index_q_b"]).view(B, T, H, D).transpose(1, 2)                 # [B, H, T, D]
        n = T // r
        k = layer_norm(F.linear(x[:, :n * r], w["index_k"]), w["index_k_norm"], self.norm_eps) + w["index_k_norm_bias"]
        gate = F.linear(x[:, :n * r], w["index_gate"]).view(B, n, r, D) + w["index_ape"]     # [B, n, r, D]
        pooled = (gate.softmax(dim=2) * k.view(B, n, r, D)).sum(2)                         # [B, n, D]
        weights = F.linear(x, w["index_proj"]) * (1.0 / math.sqrt(D * H))                 # [B, T, H]
        scores = (torch.relu(q @ pooled[:, None].transpose(-1, -2)) * weights.transpose(1, 2)[..., None]).sum(1)
        visible = ((torch.arange(T) + 1) // r).expand(B, T).contiguous()                   # [B, T] pools complete
        picked = np.zeros((B, T, n), dtype=np.bool_)
        from .heap_select import select_top_k

        select_top_k(scores.cpu().numpy().reshape(B * T, n), visible.numpy().reshape(-1), self.top_k // r,
                     picked.reshape(B * T, n))
        keys = torch.arange(T, device=x.device)
        selected = F.pad(torch.from_numpy(picked).to(x.device).repeat_interleave(r, dim=-1), (0, T - n * r))
        if self.tail:   # the query's own pool, incomplete: its keys from the last complete pool's end
            start = (keys + 1) // r * r
            selected |= (keys[None, :] >= start[:, None]) & (keys[None, :] <= keys[:, None])
        return selected


class Glm5NextLayer(HyV4Layer):
    """llama.cpp's glm5-next graph, one layer: forward(x [B, T, width in]) -> [B, T, count x hidden],
    and the selection (glm_dsa.pack_selection, `top_k` keys a query at most) beside it where a later
    shared layer takes it."""

    def forward(self, x: torch.Tensor, tables, state=None) -> torch.Tensor:
        B, T, _ = x.shape
        x, selected = unpack_selection(x, self.top_k) if self.carried_in else (x, None)
        h = self.streams(x)                                                              # [B, T, count, hidden]
        a, post, comb = self.attn_mixer(h)
        a = self.norm(a, self.attn_norm)
        if isinstance(self.mixer, KPoolAttention):
            out, selected = self.mixer(a, tables, selected)
        else:
            out = self.mixer(a, tables, state)
        h = write_back(h, out, post, comb)
        f, post, comb = self.ffn_mixer(h)
        h = write_back(h, self.ffn(self.norm(f, self.ffn_norm)), post, comb).reshape(B, T, -1)
        return torch.cat([h, pack_selection(selected, self.top_k, h.dtype)], dim=-1) if self.carried_out else h


class StreamMean(nn.Module):
    """The head's collapse: streams [..., count, hidden] -> (their mean [..., hidden],)."""

    def forward(self, streams: torch.Tensor):
        return (wide(streams).mean(-2).to(streams.dtype),)


class Glm5Next(HyperConnections, KimiLinear):
    packs_sequences = False    # its indexer pools keys by their place in the row
    numerics = 1
    own_head_required = True
    sliceable_experts = False   # a layer may hand the selection on beside its output: held whole (glm-dsa's)
    float32_tensors = KimiLinear.float32_tensors + ("_fn.weight", "_base.weight", "_scale.weight",
                                                    "indexer_compressor_ape.weight", "indexer_compressor_gate.weight",
                                                    "indexer.attn_q_b.weight", "indexer.attn_k.weight",
                                                    "indexer.k_norm.bias", "indexer.proj.weight")
    honours = Deepseek2.honours - {Keys.Rope.SCALING_YARN_LOG_MUL} | {
        Keys.LLM.SWIGLU_CLAMP_EXP, Keys.LLM.SWIGLU_CLAMP_SHEXP, Keys.Attention.Indexer.HEAD_COUNT,
        Keys.Attention.Indexer.KEY_LENGTH, Keys.Attention.Indexer.TOP_K}
    required_keys = REQUIRED_KEYS
    gate_lower_bound = KimiK3.gate_lower_bound
    gated_unit = Deepseek4.gated_unit

    def __init__(self, gguf):
        super().__init__(gguf)
        self.kpool = int(self.key(KPOOL))
        self.top_k = int(self.key(Keys.Attention.Indexer.TOP_K))
        if self.kpool < 2 or self.top_k % self.kpool:
            raise UserError(f"{gguf.path}: indexer.top_k {self.top_k} in pools of {self.kpool}; llama.cpp computes "
                            f"pools of 2 keys or more that divide top_k")
        if self.count != 4:
            raise UserError(f"{gguf.path}: {self.count} hyper-connection streams; llama.cpp computes GLM-5.3-Flash "
                            f"with 4")
        dsa = [s.index for s in self.specs if s.mixer != "kda"]
        if dsa and not self.indexer_full(dsa[0]):
            raise UserError(f"{gguf.path}: layer {dsa[0]} shares the selection of an earlier layer, and there is "
                            f"none (attention.indexer.types)")
        self.tail = bool(self.key(KPOOL_SELECT_TAIL, False))

    def check_loader_tensors(self) -> None:
        """The generic check, then what llama.cpp's glm5-next loader requires beyond it: K_b and V_b
        apart on latent attention (no attn_kv_b); the dense blocks' gate; the experts' gates,
        selection bias and shared expert."""
        super().check_loader_tensors()
        for spec in self.specs:
            if spec.mixer != "kda" and (joined := f"blk.{spec.index}.attn_kv_b.weight") in self.gguf.tensors:
                raise UserError(f"{self.gguf.path}: tensor {joined}: llama.cpp's glm5-next loader takes attn_k_b "
                                f"and attn_v_b only")
            kinds = ("ffn_gate.weight",) if spec.ffn == "mlp" else (
                "exp_probs_b.bias", "ffn_gate_exps.weight", "ffn_gate_shexp.weight", "ffn_up_shexp.weight",
                "ffn_down_shexp.weight")
            if missing := [f"blk.{spec.index}.{kind}" for kind in kinds
                           if f"blk.{spec.index}.{kind}" not in self.gguf.tensors]:
                raise UserError(f"{self.gguf.path}: missing tensor {missing[0]}")

    # -- settings --------------------------------------------------------------------------
    def read_gating(self) -> str:
        return self.gating_in_file("sigmoid")

    def layer_spec(self, i: int) -> LayerSpec:
        if self.trunk_rope.dim:
            raise UserError(f"{self.gguf.path}: rope.dimension_count is {self.trunk_rope.dim}; llama.cpp computes "
                            f"GLM-5.3-Flash's latent attention without RoPE (0)")
        return super().layer_spec(i)

    def normalizes_expert_weights(self) -> bool:
        return self.weights_norm_in_file()

    def kda_shapes(self, i: int) -> list[tuple[str, tuple[int, ...], str, bool]]:
        """kimi-linear's, Q, K and V apart: llama.cpp's graph projects a KDA layer by attn_q, attn_k and
        attn_v (a fused attn_qkv would leave them unloaded)."""
        return [(kind, shape, why, required or kind in ("attn_q", "attn_k", "attn_v"))
                for kind, shape, why, required in super().kda_shapes(i) if kind != "attn_qkv"]

    def indexer_full(self, i: int) -> bool:
        types = self.gguf.arch_value(INDEXER_TYPES)
        return bool(types[i]) if isinstance(types, np.ndarray) else True

    @functools.cached_property
    def selection_width(self) -> int:
        """Keys a query attends to at most: its pools' and its incomplete pool's."""
        return self.top_k + (self.kpool - 1 if self.tail else 0)

    def carries_selection(self, cut: int) -> bool:
        """Whether the boundary before layer `cut` holds the selection of the last full layer before
        it: the next latent-attention layer from `cut` on is a shared one."""
        if cut == 0:
            return False
        later = [s.index for s in self.specs[cut:] if s.mixer != "kda"]
        return bool(later) and not self.indexer_full(later[0])

    def boundary_width(self, cut: int) -> int:
        return super().boundary_width(cut) + (2 * self.selection_width if self.carries_selection(cut) else 0)

    # -- layers ----------------------------------------------------------------------------
    def sinkhorn_mixer(self, t, prefix: str) -> SinkhornMixer:
        return SinkhornMixer(t(f"{prefix}_fn"), t(f"{prefix}_base"), t(f"{prefix}_scale"), float(self.key(HC_EPS)),
                             self.hp.eps, int(self.key(HC_SINKHORN)))

    def layer(self, spec: LayerSpec, t: BlockTensors) -> Glm5NextLayer:
        i = spec.index
        return Glm5NextLayer(spec, self.hp.eps, self.count, self.hp.hidden, self.selection_width,
                             self.carries_selection(i), self.carries_selection(i + 1),
                             attn_mixer=self.sinkhorn_mixer(t, "hc_attn"), attn_norm=t(MT.ATTN_NORM),
                             mixer=self.mixer(spec, t), ffn_mixer=self.sinkhorn_mixer(t, "hc_ffn"),
                             ffn_norm=t(MT.FFN_NORM), ffn=self.ffn(spec, t))

    def mixer(self, spec: LayerSpec, t: BlockTensors) -> nn.Module:
        if spec.mixer == "kda":
            return self.kda(t)
        latent = Deepseek2.mixer(self, spec, t)
        w, heads, dim = dict(latent.w), 0, 0
        if self.indexer_full(spec.index):
            w |= {"index_q_b": t(MT.INDEXER_ATTN_Q_B), "index_k": t(MT.INDEXER_ATTN_K),
                  "index_k_norm": t(MT.INDEXER_K_NORM), "index_k_norm_bias": t(MT.INDEXER_K_NORM, "bias"),
                  "index_proj": t(MT.INDEXER_PROJ), "index_gate": t("indexer_compressor_gate"),
                  "index_ape": t("indexer_compressor_ape")}
            heads = int(self.key(Keys.Attention.Indexer.HEAD_COUNT))
            dim = int(self.key(Keys.Attention.Indexer.KEY_LENGTH))
        return KPoolAttention(w, spec.attention, self.hp.eps, self.kv_rank(), heads, dim, self.top_k, self.kpool,
                              self.tail, float(self.key(Keys.Attention.LAYERNORM_EPS, 0.0)))

    def kda(self, t: BlockTensors) -> LowRankSafeGateDeltaAttention:
        mixer, bound = super().kda(t), self.gate_lower_bound()
        w = mixer.w
        if bound is not None:   # the safe gate's sigmoid reads exp(A_log): A's negation
            w["A"] = w["A"].neg()
        return LowRankSafeGateDeltaAttention(w, mixer.n_head, mixer.d_k, mixer.eps, bound)

    # -- the head --------------------------------------------------------------------------
    def load_head(self, device, dtype) -> StreamsHead:
        norm = read_tensor(self.gguf, "output_norm.weight", device, torch.promote_types(dtype, torch.float32))
        return StreamsHead(StreamMean(), norm, read_tensor(self.gguf, "output.weight", device, dtype), self.hp.eps,
                           self.count)
