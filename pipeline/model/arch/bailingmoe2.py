"""bailingmoe2 (Ling and Ring 2.0: Ling-1T, Ring-1T, flash 100B, mini 16B): grouped-query
attention from one fused attn_qkv without biases, each head's Q and K RMS-normed before a partial
NeoX RoPE (half the head where the file says so); leading dense SwiGLU blocks, then experts
routed by sigmoid with a selection bias, group-limited (a group's score: its two best experts'),
the top-k weights renormalised and scaled, beside one ungated shared expert. The multi-token
prediction blocks after the trunk (nextn_predict_layers) are not run, as llama.cpp loads and
skips them."""
from gguf import Keys

from .audit import equals
from .family import DecoderArch, DenseThenSigmoidExperts


class BailingMoe2(DenseThenSigmoidExperts, DecoderArch):
    neox_rope = True   # the converter leaves Q and K as they are: pairs half the rotated width apart
    own_head_required = True
    uncomputed_tensors = ("blk.{bid}.attn_qkv.bias", "blk.{bid}.attn_output.bias")   # llama.cpp: no attention biases

    def read_gating(self) -> str:
        return self.gating_in_file(None)   # llama.cpp stops on a file that names no gating function

    def settings_not_computed(self) -> dict:
        # llama.cpp sizes the shared experts as expert_shared_count times the key (which the
        # converter already writes as their total): one shared expert, as every release has
        return super().settings_not_computed() | {Keys.LLM.EXPERT_SHARED_COUNT: equals(1)}

