"""laguna (poolside's Laguna: XS.2 30B-A3B, S.2 118B-A8B, M.1 230B-A10B): llama's pre-norm layer
with per-head QK-norm before RoPE half the width apart, and a softplus gate of the layer's input on
the heads' outputs (`attn_gate`: one per head, or one per value where the tensor is that wide),
each layer with its own head count; where the file sets a sliding window, three layers of four
slide (the first of each four global: llama.cpp's fixed pattern, else the file's), rotating
`rope.dimension_count_swa` at `rope.freq_base_swa` without the scaling (YaRN) the global layers
take; leading dense SwiGLU blocks, then experts routed by the file's gating function (sigmoid
where it names none) with a selection bias, the file's weight norm and scale, beside an ungated
shared expert `expert_shared_feed_forward_length` wide.

As llama.cpp's loader reads it: the QK-norms, the gate (as wide as the heads or their values:
it aborts otherwise), the selection bias, every gate projection and the shared expert are
required; it loads no output or MLP bias, shared-expert gate nor `rope_freqs` (a file with one
is refused). Its graph gives every layer layer 0's head size (a file whose sliding layers have
head sizes of their own is refused) and every global layer layer 0's rotated width (the sliding
one, where layer 0 slides)."""
import functools
from dataclasses import replace

import torch.nn.functional as F
from gguf import MODEL_TENSOR as MT
from gguf import TENSOR_NAMES, Keys

from ...errors import UserError
from .blocks import Attention, AttentionSpec
from .family import DecoderArch, DenseThenSigmoidExperts, LayerSpec
from .loading import BlockTensors
from .shapes import expect

# tensors that the layers this family reuses read where the file has them, and that llama.cpp's
# laguna loader does not load (so refuses a file that holds)
UNLOADED = ((MT.ROPE_FREQS, "weight"), (MT.ATTN_OUT, "bias"), (MT.FFN_UP, "bias"), (MT.FFN_DOWN, "bias"),
            (MT.FFN_GATE_INP_SHEXP, "weight"))


class SoftplusGatedAttention(Attention):
    own_gate = staticmethod(F.softplus)   # diff: softplus(gate), not sigmoid(gate)


class Laguna(DenseThenSigmoidExperts, DecoderArch):
    neox_rope = True
    swa_period, swa_dense_first = 4, True   # llama.cpp's load_swa_pattern(4, dense_first)
    honours = DenseThenSigmoidExperts.honours | {Keys.Attention.SLIDING_WINDOW, Keys.Attention.SLIDING_WINDOW_PATTERN}

    def __init__(self, gguf):
        super().__init__(gguf)
        path, hp = gguf.path, self.hp
        for i in range(hp.n_layers):
            for kind, suffix in UNLOADED:
                if self.has_tensor(i, kind, suffix):
                    raise UserError(f"{path}: tensor {TENSOR_NAMES[kind].format(bid=i)}.{suffix} is not part of the "
                                    f"laguna layer llama.cpp loads (it refuses such a file)")
        if self.specs[0].attention.value_dim != hp.head_dim:
            raise UserError(f"{path}: value_length is not key_length {hp.head_dim} (llama.cpp's laguna graph "
                            f"asserts they are equal)")
        if self.windowed:
            for template in (Keys.Attention.KEY_LENGTH_SWA, Keys.Attention.VALUE_LENGTH_SWA):
                if int(self.key(template, hp.head_dim)) != hp.head_dim:
                    raise UserError(f"{path}: {template.format(arch=gguf.architecture)} is not key_length "
                                    f"{hp.head_dim}; llama.cpp's laguna graph gives every layer layer 0's head size")
        for spec in self.specs:
            for name, shape in self.loader_shapes(spec).items():
                expect(self, name, shape, "as llama.cpp's laguna loader takes it", required=True)

    @functools.cached_property
    def windowed(self) -> bool:
        """Whether the file sets a sliding window (else every layer attends globally)."""
        return int(self.key(Keys.Attention.SLIDING_WINDOW, 0)) > 0

    def loader_shapes(self, spec: LayerSpec) -> dict[str, tuple[int, ...]]:
        """The tensors of a layer that llama.cpp's loader requires beyond those every family requires
        (shapes.py), with the shapes it takes them in."""
        a, hidden = spec.attention, self.hp.hidden
        gate = self.gguf.tensors.get(f"{TENSOR_NAMES[MT.ATTN_GATE].format(bid=spec.index)}.weight")
        gates = a.n_head * a.key_dim if gate is not None and gate.shape[0] == a.n_head * a.key_dim else a.n_head
        kinds = {MT.ATTN_Q_NORM: (a.key_dim,), MT.ATTN_K_NORM: (a.key_dim,), MT.ATTN_GATE: (gates, hidden)}
        if spec.ffn == "mlp":
            ff = int(self.layer_key(Keys.LLM.FEED_FORWARD_LENGTH, 0))
            kinds |= {MT.FFN_GATE: (ff, hidden), MT.FFN_UP: (ff, hidden), MT.FFN_DOWN: (hidden, ff)}
        else:
            n_expert = int(self.key(Keys.LLM.EXPERT_COUNT))
            ff = int(self.layer_key(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, 0))   # layer 0's, as llama.cpp reads it
            shared = int(self.key(Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH,
                                  ff * int(self.key(Keys.LLM.EXPERT_SHARED_COUNT, 1))))
            kinds |= {MT.FFN_EXP_PROBS_B: (n_expert,), MT.FFN_GATE_EXP: (n_expert, ff, hidden),
                      MT.FFN_UP_EXP: (n_expert, ff, hidden), MT.FFN_DOWN_EXP: (n_expert, hidden, ff),
                      MT.FFN_GATE_SHEXP: (shared, hidden), MT.FFN_UP_SHEXP: (shared, hidden),
                      MT.FFN_DOWN_SHEXP: (hidden, shared)}
        return {f"{TENSOR_NAMES[kind].format(bid=spec.index)}.{'bias' if kind == MT.FFN_EXP_PROBS_B else 'weight'}":
                shape for kind, shape in kinds.items()}

    def ffn_kind(self, i: int) -> str:
        self.key(Keys.LLM.LEADING_DENSE_BLOCK_COUNT)   # required by llama.cpp's loader
        return super().ffn_kind(i)

    def slides(self, i: int) -> bool:
        return self.windowed and self.is_sliding(i)

    def attention_spec(self, i: int) -> AttentionSpec:
        spec = super().attention_spec(i)
        swa_dim = int(self.key(Keys.Rope.DIMENSION_COUNT_SWA, spec.rope.dim))
        if not self.slides(i):   # llama.cpp's graph rotates a global layer by layer 0's width (n_rot())
            return replace(spec, rope=replace(spec.rope, dim=swa_dim)) if self.slides(0) else spec
        # diff: RoPE of its own width and base, without the global layers' scaling
        return self.sliding(replace(spec, rope=replace(spec.rope, dim=swa_dim, scale=1.0, mscale=1.0, yarn=None)))

    def attention(self, spec: AttentionSpec, t: BlockTensors) -> SoftplusGatedAttention:
        return SoftplusGatedAttention(self.attention_weights(spec, t) | {"gate": t(MT.ATTN_GATE)}, spec, self.hp.eps)
