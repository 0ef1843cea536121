"""apertus (Apertus 8B, 70B): llama's pre-norm layer with each head's Q and K RMS-normed before
NeoX RoPE on the whole head (Llama-3 `rope_freqs` where the file has them), and an ungated MLP,
down(xIELU(up x)), whose xIELU has parameters of its own per layer: `xielu.alpha_n`, `alpha_p`,
`beta` and `eps` (keys without the architecture's prefix; one value for every layer or one per
layer, as llama.cpp's loader reads them), the alphas as the checkpoint stores them, before
ggml_xielu's softplus. llama.cpp's loader requires the QK-norms and the LM head; the QK-norm
biases it may load are not in its graph (refused), nor are an output bias or MLP biases."""
import functools
import math

import numpy as np
import torch
from gguf import MODEL_TENSOR as MT
from gguf import Keys

from ...errors import UserError
from .family import DecoderArch, LayerSpec
from .ffn import MLP
from .hunyuan_moe import WholeHeadRope
from .loading import BlockTensors

XIELU = (Keys.xIELU.ALPHA_N, Keys.xIELU.ALPHA_P, Keys.xIELU.BETA, Keys.xIELU.EPS)


def xielu(x: torch.Tensor, alpha_n: float, alpha_p: float, beta: float, eps: float) -> torch.Tensor:
    """ggml's xIELU, its alphas already through softplus (alpha_n with beta added):
    alpha_p x^2 + beta x above 0, else (expm1(min(x, eps)) - x) alpha_n + beta x. In place past
    two temporaries the size of x, as a wide MLP's activation must be."""
    negative = x.clamp(max=eps).expm1_().sub_(x).mul_(alpha_n).masked_fill_(x > 0, 0.0)
    return x.clamp(min=0.0).square_().mul_(alpha_p).add_(negative).add_(x, alpha=beta)


def softplus(x: float) -> float:
    return x if x > 20.0 else math.log1p(math.exp(x))   # ggml's: linear past 20


class Apertus(WholeHeadRope, DecoderArch):
    neox_rope = True   # the converter leaves Q and K as they are
    own_head_required = True
    required_tensors = ("blk.{bid}.attn_q_norm.weight", "blk.{bid}.attn_k_norm.weight")
    uncomputed_tensors = ("output.bias", "blk.{bid}.attn_q_norm.bias", "blk.{bid}.attn_k_norm.bias")

    def __init__(self, gguf):
        super().__init__(gguf)
        self.units = self.xielu_units()

    def xielu_units(self) -> list[functools.partial]:
        """Each layer's xIELU from the four keys, each one value or one per layer."""
        n, columns = self.hp.n_layers, []
        for template in XIELU:
            value = self.key(template)
            if isinstance(value, np.ndarray) and len(value) != n:
                raise UserError(f"{self.gguf.path}: {template} has {len(value)} values for {n} layers")
            columns.append(np.broadcast_to(np.asarray(value, dtype=np.float64), (n,)).tolist())
        return [functools.partial(xielu, alpha_n=beta + softplus(alpha_n), alpha_p=softplus(alpha_p), beta=beta,
                                  eps=eps) for alpha_n, alpha_p, beta, eps in zip(*columns)]

    def ffn(self, spec: LayerSpec, t: BlockTensors) -> MLP:
        return MLP(t(MT.FFN_UP), t(MT.FFN_DOWN), None, self.units[spec.index])
