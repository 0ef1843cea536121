"""The modules a window runs: a layer (its parts as the family reads them, its forward the
family's graph), the per-length tables its attention reads, and the final norm + LM head."""
import torch
import torch.nn.functional as F
from torch import nn

from ..scoring import WIDENED_SLICE_BYTES, bfloat16_kernels
from .blocks import Temperature, Weights, causal_mask, module_bytes, packed_mask, rms_norm, temperature_factors
from .rope import RopeSpec, rope_tables


class Tables:
    """RoPE tables, attention masks and query temperatures of rows of one length, built once per
    layer-window task; for packed rows (a layout [B, T, LAYOUT_FIELDS]: position, sequence,
    branch), once per chunk, each token's taken at its position and the mask the layout's."""

    def __init__(self, n_pos: int, device, dtype, layout: torch.Tensor | None = None):
        self.n_pos, self.device, self.dtype, self.layout = n_pos, device, dtype, layout
        self._rope, self._mask, self._temperature = {}, {}, {}

    def rope(self, spec: RopeSpec, dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, dim / 2] (packed rows: [B, 1, T, dim / 2]) in the compute dtype (or `dtype`)."""
        key = (spec, dtype or self.dtype)
        if key not in self._rope:
            self._rope[key] = tuple(self.at_positions(t) for t in rope_tables(spec, self.n_pos, self.device, key[1]))
        return self._rope[key]

    def mask(self, span: int | None, chunk: int | None = None) -> torch.Tensor | None:
        """[T, T] (packed rows: [B, 1, T, T]) bool, True = attend; None: plain causal."""
        if (span, chunk) not in self._mask:
            self._mask[span, chunk] = (causal_mask(self.n_pos, span, self.device, chunk) if self.layout is None
                                       else packed_mask(self.layout, span, chunk))
        return self._mask[span, chunk]

    def temperature(self, t: Temperature) -> torch.Tensor:
        """[T, 1] (packed rows: [B, 1, T, 1]) query factors."""
        if t not in self._temperature:
            self._temperature[t] = self.at_positions(temperature_factors(t, self.n_pos, self.device, self.dtype))
        return self._temperature[t]

    def at_positions(self, table: torch.Tensor) -> torch.Tensor:
        """A table [n_pos, ...] by position -> each token's: the table itself for rows whose
        positions are 0..T-1, else [B, 1, T, ...] (broadcast over heads)."""
        return table if self.layout is None else table[self.layout[..., 0]][:, None]


class Layer(Weights):
    """One layer: its blocks (modules) and norm weights (tensors), as the family's `layer` reads
    them, and, in `forward`, the family's graph over them, straight-line code as llama.cpp's
    `llm_build_*`. forward(x [B, T, hidden], tables, state) -> [B, T, hidden]; `state` is the
    recurrent state carried in and out (None: zero for every row)."""

    def __init__(self, spec, eps: float, **parts: nn.Module | torch.Tensor | None):
        blocks = {name: part for name, part in parts.items() if isinstance(part, nn.Module)}
        super().__init__({name: part for name, part in parts.items() if name not in blocks})
        for name, block in blocks.items():
            self.add_module(name, block)
        self.spec, self.eps = spec, eps

    def norm(self, x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        return rms_norm(x, weight, self.eps)

    @property
    def nbytes(self) -> int:
        return module_bytes(self)

    def describe(self) -> str:
        s = self.spec
        return f"layer {s.index}: {s.mixer or 'no mixer'}, {s.ffn or 'no feed-forward'}"


class StreamsLayer(Layer):
    """A layer of a family whose residual is `count` streams of `hidden` (hyper-connections): its
    input boundary holds them side by side, or (layer 0) the embedding, one stream."""

    def __init__(self, spec, eps: float, count: int, hidden: int, **parts):
        super().__init__(spec, eps, **parts)
        self.count, self.hidden = count, hidden

    def streams(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, count x hidden or hidden] -> [B, T, count, hidden], the embedding in every stream."""
        B, T, _ = x.shape
        return x.view(B, T, -1, self.hidden).expand(B, T, self.count, self.hidden)


class OneBlockLayer(Layer):
    """llama.cpp's llm_build_mamba and llm_build_nemotron_h: one block (a mixer or a feed-forward
    block) behind one norm, its output added to the stream."""

    def forward(self, x: torch.Tensor, tables, state: dict | None = None) -> torch.Tensor:
        return x + self.op(self.norm(x, self.attn_norm), tables, state)


class PreNormLayer(Layer):
    """llama.cpp's llm_build_llama, the layer most families share: the mixer over the normed
    stream, then the feed-forward block over the normed sum."""

    def forward(self, x: torch.Tensor, tables, state: dict | None = None) -> torch.Tensor:
        h = x + self.mixer(self.norm(x, self.attn_norm), tables, state)
        return h + self.ffn(self.norm(h, self.ffn_norm))


class PrePostNormLayer(Layer):
    """llama.cpp's llm_build_gemma3 and llm_build_glm4: each block between a norm of its input and
    a norm of its output (`post_norm`), which then joins the stream."""

    def forward(self, x: torch.Tensor, tables, state=None) -> torch.Tensor:
        h = x + self.post_norm(self.attention(self.norm(x, self.attn_norm), tables), self.attn_post_norm)
        return h + self.post_norm(self.ffn(self.norm(h, self.ffn_norm)), self.ffn_post_norm)

    def post_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return self.norm(x, weight)


class PostNormLayer(Layer):
    """llama.cpp's llm_build_olmo2 and llm_build_exaone4: each block over the stream itself, its
    output normed before it joins the stream."""

    def forward(self, x: torch.Tensor, tables, state=None) -> torch.Tensor:
        h = x + self.norm(self.attention(x, tables), self.attn_post_norm)
        return h + self.norm(self.ffn(h), self.ffn_post_norm)


class Head(Weights):
    """Final norm + LM head: hidden [N, hidden] -> float32 logits [N, vocab], ended by the
    family's `finish` (DecoderArch.finish_logits; None: as they are); the norm is `normalize`
    (RMSNorm, or the family's)."""

    def __init__(self, norm: torch.Tensor, weight: torch.Tensor, eps: float, finish=None, normalize=rms_norm):
        super().__init__({"norm": norm, "weight": weight})
        self.eps, self.finish, self.normalize = eps, finish, normalize

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits(self.normalize(x.float(), self.norm, self.eps), self.weight)

    def logits(self, normed: torch.Tensor, weight: torch.Tensor, widened: torch.Tensor | None = None) -> torch.Tensor:
        # float32 logits [N, S], accumulated in float32 from 16-bit weights too (logits rounded to
        # bfloat16 before the log-sum-exp lie on a 0.125 grid at 16). A 16-bit head multiplies the
        # normed state rounded to its dtype, as every product of the trunk in that dtype does; its
        # float32 copy goes into `widened` ([>= S, hidden] float32) where one is given.
        wide = weight
        if weight.dtype.itemsize < 4:
            normed = normed.to(weight.dtype).float()
            wide = weight.float() if widened is None else widened[:weight.shape[0]].copy_(weight)
        with bfloat16_kernels(weight):
            z = F.linear(normed, wide)
        return z if self.finish is None else self.finish(z)

    def logit_slices(self, x: torch.Tensor, width: int):
        """x [N, hidden] -> (first id, float32 logits [N, <= width]) per slice of the vocabulary,
        so that all N x vocab logits never exist at once. With 16-bit weights each slice is
        widened into one float32 buffer of at most WIDENED_SLICE_BYTES (which narrows the slices
        of a wide model), allocated once per call: a fresh copy per slice page-faults its memory
        anew (26 ms against 2 ms for a 16384 x 896 slice)."""
        normed = self.normalize(x.float(), self.norm, self.eps)             # [N, hidden] float32
        widened = None
        if self.weight.dtype.itemsize < 4:
            width = min(width, max(1, WIDENED_SLICE_BYTES // (4 * self.weight.shape[1])))
            widened = torch.empty((min(width, self.weight.shape[0]), self.weight.shape[1]), dtype=torch.float32,
                                  device=self.weight.device)                  # [width, hidden]
        for start in range(0, self.weight.shape[0], width):
            yield start, self.logits(normed, self.weight[start:start + width], widened)


class StreamsHead(Head):
    """The head of a family whose residual is several streams (hyper-connections): the family's
    mixer collapses streams [..., count x hidden] into one hidden state (its first output), the
    final norm (None: the mixer stands in for it) and the LM head follow."""

    def __init__(self, mixer: nn.Module, norm: torch.Tensor | None, weight: torch.Tensor, eps: float, count: int):
        super().__init__(norm, weight, eps, normalize=self.collapse)
        self.mixer, self.count = mixer, count

    def collapse(self, x: torch.Tensor, norm: torch.Tensor | None, eps: float) -> torch.Tensor:
        mixed = self.mixer(x.unflatten(-1, (self.count, -1)))[0]                      # [..., hidden]
        return mixed if norm is None else rms_norm(mixed, norm, eps)
