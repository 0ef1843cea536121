"""dots1 (dots.llm1, 142B-A14B): Qwen3's layer -- Q/K/V (biases where the file has them), each head's
Q and K RMS-normed before RoPE half the width apart, no output bias -- with leading dense SwiGLU blocks,
then experts routed by the file's gating function (sigmoid as published; llama.cpp's graph aborts on a
file that names none) with a selection bias, expert groups, the file's weight norm and scale, beside
expert_shared_count shared experts held as one SwiGLU MLP of that many times the expert width.

As llama.cpp's loader reads it: as many KV heads as heads (K and V are head_count x key_length rows),
values as wide as keys, the whole head rotated (its graph asserts both), an LM head of its own (no tied
embeddings), the QK-norms, the dense gate and the experts' gate required."""
from gguf import MODEL_TENSOR as MT
from gguf import Keys

from ...errors import UserError
from .blocks import AttentionSpec
from .family import DenseThenSigmoidExperts
from .loading import BlockTensors
from .qwen2 import Qwen2
from .shapes import expect


class Dots1(DenseThenSigmoidExperts, Qwen2):
    own_head_required = True

    def __init__(self, gguf):
        super().__init__(gguf)
        path, hp = gguf.path, self.hp
        if self.trunk_rope.dim != hp.head_dim:
            raise UserError(f"{path}: rope.dimension_count {self.trunk_rope.dim} is not key_length {hp.head_dim} "
                            f"(llama.cpp's dots1 graph rotates whole heads)")
        ff_exp = int(self.key(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH))
        n_shared = int(self.key(Keys.LLM.EXPERT_SHARED_COUNT))
        for spec in self.specs:
            a, i = spec.attention, spec.index
            if a.n_kv != a.n_head or a.value_dim != a.key_dim:
                raise UserError(f"{path}: layer {i} has {a.n_head} heads of {a.key_dim} and {a.n_kv} KV heads of "
                                f"{a.value_dim}; llama.cpp's dots1 loader takes as many KV heads as heads, values "
                                f"as wide as keys")
            required = ["attn_q_norm", "attn_k_norm"] + (["ffn_gate"] if spec.ffn == "mlp" else ["ffn_gate_exps"])
            for kind in required:   # optional in the classes this one reuses, required by llama.cpp's loader
                if f"blk.{i}.{kind}.weight" not in gguf.tensors:
                    raise UserError(f"{path}: missing tensor blk.{i}.{kind}.weight")
            if spec.ffn == "moe":   # the shared experts: one MLP of expert_shared_count x the expert width
                why = "expert_shared_count x expert_feed_forward_length"
                for kind in ("ffn_up_shexp", "ffn_gate_shexp"):
                    expect(self, f"blk.{i}.{kind}.weight", (n_shared * ff_exp, hp.hidden), why + " x embedding_length",
                           required=True)
                expect(self, f"blk.{i}.ffn_down_shexp.weight", (hp.hidden, n_shared * ff_exp),
                       "embedding_length x " + why, required=True)

    def read_gating(self) -> str:
        return self.gating_in_file(None)   # llama.cpp's graph aborts on a file that names none

    def attention_weights(self, spec: AttentionSpec, t: BlockTensors) -> dict:
        if t.has(MT.ATTN_OUT, "bias"):     # llama.cpp's loader has none: it refuses such a file
            raise UserError(f"{t.gguf.path}: tensor {t.name(MT.ATTN_OUT, 'bias')} is not part of the dots1 layer "
                            f"layercycle computes (llama.cpp's graph has no attention output bias)")
        return super().attention_weights(spec, t)
