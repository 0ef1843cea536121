"""glm-dsa (GLM-5, GLM-5.2): deepseek32's layers with the indexer's RoPE on consecutive pairs,
sigmoid routing where the file names no gating function, and, on GLM-5.2, "shared" layers
without an indexer that attend to the keys the last "full" layer before them selected
(attention.indexer.types; files without it: every layer full below a 1M-token context, else
GLM-5.2's published pattern, as llama.cpp's loader reads them).

A boundary between a full layer and the shared layers after it carries that selection beside the
hidden state: each query's selected key positions, ascending, as two values each, position // 256
and position % 256 (-1 and 255 where the query has fewer), integers that 16-bit boundaries hold
exactly.
"""
import functools
from dataclasses import replace

import numpy as np
import torch
from gguf import MODEL_TENSOR as MT
from gguf import Keys

from ...errors import UserError
from .deepseek2 import Deepseek2
from .deepseek32 import Deepseek32, SparseLatentAttention
from .family import LayerSpec
from .loading import BlockTensors
from .modules import PreNormLayer
from .rope import RopeSpec

INDEXER_TYPES = "{arch}.attention.indexer.types"
LONG_CONTEXT = 1048576     # llama.cpp: files below it predate GLM-5.2, every indexer full
GLM52_FULL = (0, 1, 2) + tuple(range(6, 78, 4))   # GLM-5.2's full layers (llama.cpp's default table)
POSITION_BASE = 256        # a position as two integers below it


class SharedSelectionAttention(SparseLatentAttention):
    """Sparse latent attention over a given selection (a shared layer, which has no indexer) or
    its own indexer's: (x [B, T, hidden], selection [B, T, T] bool or None) -> (output, selection)."""

    def forward(self, x: torch.Tensor, tables, selected: torch.Tensor | None = None):
        q, k, v, q_a = self.project(x, tables)
        if selected is None:
            selected = self.select(x, q_a, tables)
        return self.output(self.values(self.attend_selected(q, k, v, selected))), selected


class GlmDsaLayer(PreNormLayer):
    """deepseek32's layer, its selection taken from the boundary (a shared layer) and left in the
    next one where a shared layer follows. forward(x [B, T, hidden (+ 2 top_k)]) -> the same."""

    def __init__(self, spec, eps, top_k: int, carried_in: bool, carried_out: bool, **parts):
        super().__init__(spec, eps, **parts)
        self.top_k, self.carried_in, self.carried_out = top_k, carried_in, carried_out

    def forward(self, x: torch.Tensor, tables, state=None) -> torch.Tensor:
        h, selected = (unpack_selection(x, self.top_k) if self.carried_in else (x, None))
        a, selected = self.mixer(self.norm(h, self.attn_norm), tables, selected)
        h = h + a
        h = h + self.ffn(self.norm(h, self.ffn_norm))
        return torch.cat([h, pack_selection(selected, self.top_k, h.dtype)], dim=-1) if self.carried_out else h


def pack_selection(selected: torch.Tensor, top_k: int, dtype) -> torch.Tensor:
    """selected [B, T, T] bool (at most top_k keys a query) -> [B, T, 2 top_k]: the positions,
    ascending, // 256 then % 256; -1, 255 past a query's last."""
    B, T, _ = selected.shape
    keys = torch.arange(T, device=selected.device)
    positions = torch.where(selected, keys, T).sort(dim=-1).values[..., :top_k]          # [B, T, <= top_k]
    positions = torch.nn.functional.pad(positions, (0, top_k - positions.shape[-1]), value=T)
    positions = torch.where(positions == T, -1, positions)
    high = torch.div(positions, POSITION_BASE, rounding_mode="floor")
    return torch.cat([high, positions - high * POSITION_BASE], dim=-1).to(dtype)


def unpack_selection(x: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [B, T, hidden + 2 top_k] -> (hidden [B, T, hidden], selected [B, T, T] bool)."""
    B, T, _ = x.shape
    h, high, low = x.split([x.shape[-1] - 2 * top_k, top_k, top_k], dim=-1)
    positions = (high.float() * POSITION_BASE + low.float()).long()                      # [B, T, top_k]
    positions = torch.where(positions < 0, T, positions)
    selected = torch.zeros(B, T, T + 1, dtype=torch.bool, device=x.device).scatter_(-1, positions, True)
    return h, selected[..., :T]


class GlmDsa(Deepseek32):
    sliceable_experts = False   # its layer hands the selection on beside its output: held whole

    def read_gating(self) -> str:
        return self.gating_in_file("sigmoid")

    def __init__(self, gguf):
        super().__init__(gguf)
        if not self.indexer_full(0):
            raise UserError(f"{gguf.path}: layer 0 shares the selection of an earlier layer, and there is none")

    @functools.cached_property
    def index_rope(self) -> RopeSpec:
        """The trunk's RoPE on consecutive pairs (llama.cpp's NORM) of each indexer head."""
        return replace(self.trunk_rope, neox=False)

    def indexer_full(self, i: int) -> bool:
        types = self.gguf.arch_value(INDEXER_TYPES)
        if isinstance(types, np.ndarray):
            return bool(types[i])
        if self.hp.context_length < LONG_CONTEXT:
            return True
        return i in GLM52_FULL

    def carries_selection(self, cut: int) -> bool:
        """Whether the boundary before layer `cut` holds the selection of the full layer before it."""
        return 0 < cut < self.hp.n_layers and not self.indexer_full(cut)

    def boundary_width(self, cut: int) -> int:
        top_k = int(self.key(Keys.Attention.Indexer.TOP_K))
        return self.hp.hidden + (2 * top_k if self.carries_selection(cut) else 0)

    def layer(self, spec: LayerSpec, t: BlockTensors) -> GlmDsaLayer:
        i = spec.index
        return GlmDsaLayer(spec, self.hp.eps, int(self.key(Keys.Attention.Indexer.TOP_K)),
                           self.carries_selection(i), self.carries_selection(i + 1),
                           attn_norm=t(MT.ATTN_NORM), mixer=self.mixer(spec, t), ffn_norm=t(MT.FFN_NORM),
                           ffn=self.ffn(spec, t))

    def mixer(self, spec: LayerSpec, t: BlockTensors) -> SharedSelectionAttention:
        if self.indexer_full(spec.index):
            return super().mixer(spec, t, SharedSelectionAttention)
        latent = Deepseek2.mixer(self, spec, t)      # a shared layer: no indexer of its own
        return SharedSelectionAttention(latent.w, spec.attention, self.hp.eps, self.kv_rank(), 0, 0,
                                        int(self.key(Keys.Attention.Indexer.TOP_K)), self.index_rope)
