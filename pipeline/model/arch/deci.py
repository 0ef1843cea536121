"""deci (Llama-3.1-Nemotron-51B, Llama-3.3-Nemotron-Super-49B, Llama-3.1-Nemotron-Ultra-253B): llama's
pre-norm layer with its geometry per layer, from the file's arrays: grouped-query attention with the
layer's own KV heads (head_count_kv); where a layer has heads but no KV heads, one hidden x hidden map
(attn_output alone) in attention's place; where it has no heads, neither attention nor its norm; a
SwiGLU feed_forward_length wide, none where that is 0 (with no attention either: Ultra's empty layers,
which hold no tensor). RoPE on consecutive pairs over the whole head, with Llama-3's rope_freqs where
the file has them.

As llama.cpp's loader and graph read it: a layer with attention but no feed-forward block is refused
(llama.cpp's graph then drops the layer's output, attention included, which the modeling code adds to
the stream), and so is a file whose layer 0 has no heads beside layers of attention (llama.cpp takes
the head size from layer 0). Key, value and rotated widths are equal (WholeHeadRope)."""
import torch
import torch.nn.functional as F
from gguf import MODEL_TENSOR as MT
from gguf import Keys
from torch import nn

from ...errors import UserError
from .blocks import Weights
from .family import DecoderArch, LayerSpec
from .hunyuan_moe import WholeHeadRope
from .loading import BlockTensors
from .modules import Layer
from .shapes import expect


class LinearAttention(Weights):
    """Attention replaced by one map of the normed stream, o [hidden, hidden]."""

    def forward(self, x: torch.Tensor, tables=None, state=None) -> torch.Tensor:
        return F.linear(x, self.o)


class DeciLayer(Layer):
    """llama.cpp's deci graph: llama's pre-norm layer whose mixer and feed-forward block (each with
    its norm) may be absent."""

    def forward(self, x: torch.Tensor, tables, state: dict | None = None) -> torch.Tensor:
        h = x if self.mixer is None else x + self.mixer(self.norm(x, self.attn_norm), tables, state)
        return h if self.ffn is None else h + self.ffn(self.norm(h, self.ffn_norm))


class Deci(WholeHeadRope, DecoderArch):
    neox_rope = False

    def __init__(self, gguf):
        super().__init__(gguf)
        H = self.hp.hidden
        if not self.specs[0].mixer and any(spec.attention for spec in self.specs):
            raise UserError(f"{gguf.path}: layer 0 has no attention heads; llama.cpp takes the head size from "
                            f"layer 0, and loads no attention layer of such a file")
        for spec in self.specs:
            i = spec.index
            if spec.mixer == "linear":
                expect(self, f"blk.{i}.attn_output.weight", (H, H), "embedding_length x embedding_length (the map "
                       "in attention's place)", required=True)
            if spec.ffn:
                ff, why = int(self.layer_key(Keys.LLM.FEED_FORWARD_LENGTH, i)), "the layer's feed_forward_length"
                for kind, shape in (("ffn_gate", (ff, H)), ("ffn_up", (ff, H)), ("ffn_down", (H, ff))):
                    expect(self, f"blk.{i}.{kind}.weight", shape, why + " and embedding_length", required=True)

    def layer_spec(self, i: int) -> LayerSpec:
        n_head = int(self.layer_key(Keys.Attention.HEAD_COUNT, i))
        n_kv = int(self.layer_key(Keys.Attention.HEAD_COUNT_KV, i, n_head))
        ffn = "mlp" if int(self.layer_key(Keys.LLM.FEED_FORWARD_LENGTH, i, 0)) else ""
        if (n_head or n_kv) and not ffn:
            raise UserError(f"{self.gguf.path}: layer {i} has attention but no feed-forward block; llama.cpp's deci "
                            f"graph drops such a layer's output, attention included (the modeling code keeps it)")
        if n_kv:
            return LayerSpec(i, "attention", ffn, self.attention_spec(i))
        return LayerSpec(i, "linear" if n_head else "", ffn)

    def activation_floats(self, i: int) -> int:
        """DecoderArch's, and on a layer without attention (whose count has no attention's widths to
        cover the rest) its input and normed stream beside the MLP's two widths (measured at hidden
        2048, an MLP 8448 wide: a peak 1.07 times DecoderArch's count)."""
        return super().activation_floats(i) + (0 if self.specs[i].mixer else 2 * self.hp.hidden)

    def layer(self, spec: LayerSpec, t: BlockTensors) -> DeciLayer:
        return DeciLayer(spec, self.hp.eps, attn_norm=t(MT.ATTN_NORM) if spec.mixer else None,
                         mixer=self.mixer(spec, t) if spec.mixer else None,
                         ffn_norm=t(MT.FFN_NORM) if spec.ffn else None, ffn=self.ffn(spec, t) if spec.ffn else None)

    def mixer(self, spec: LayerSpec, t: BlockTensors) -> nn.Module:
        return LinearAttention({"o": t(MT.ATTN_OUT)}) if spec.mixer == "linear" else super().mixer(spec, t)
