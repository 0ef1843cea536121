"""Metadata settings that change a model's math beyond what every family reads, and the one
check that a file sets none that its family does not compute.

Each key comes with the test of a value that leaves the math as the family computes it (one
value, or one per layer). A family takes the keys it does compute out of the check
(`DecoderArch.honours`); any other key set to another value is refused by name before any
work: llama.cpp either applies it or, for these families, ignores it, and layercycle does not
guess which the file's author meant.
"""
import math

import numpy as np
from gguf import Keys

from ...errors import UserError

GATING_CODES = {"softmax": 1, "sigmoid": 2, "sqrt_softplus": 4}   # llama.cpp's llama_expert_gating_func_type


def equals(*values):
    return lambda v: all(x in values for x in np.ravel(np.asarray(v)).tolist())


def close_to(value: float):
    return lambda v: math.isclose(float(v), value, rel_tol=1e-6)


def never(v) -> bool:
    return False


NEUTRAL = {
    Keys.LLM.LOGIT_SCALE: equals(1.0),
    Keys.LLM.ATTN_LOGIT_SOFTCAPPING: equals(0.0),
    Keys.LLM.FINAL_LOGIT_SOFTCAPPING: equals(0.0),
    Keys.LLM.ROUTER_LOGIT_SOFTCAPPING: equals(0.0),
    Keys.LLM.RESIDUAL_SCALE: equals(1.0),
    Keys.LLM.EMBEDDING_SCALE: equals(1.0),
    Keys.LLM.USE_PARALLEL_RESIDUAL: equals(False),
    Keys.LLM.SWIGLU_CLAMP_EXP: equals(0.0),
    Keys.LLM.SWIGLU_CLAMP_SHEXP: equals(0.0),
    Keys.LLM.ACTIVATION_SPARSITY_SCALE: never,
    Keys.LLM.EXPERT_WEIGHTS_NORM: equals(True),        # the softmax families renormalise the top-k weights
    Keys.LLM.EXPERT_WEIGHTS_SCALE: equals(0.0, 1.0),   # 0: not set
    Keys.Attention.CLAMP_KQV: equals(0.0),
    Keys.Attention.MAX_ALIBI_BIAS: equals(0.0),
    Keys.Attention.CAUSAL: equals(True),
    Keys.Attention.SLIDING_WINDOW: equals(0),
    Keys.Attention.SLIDING_WINDOW_PATTERN: equals(False),
    Keys.Attention.OUTPUT_SCALE: equals(1.0),
    Keys.Attention.TEMPERATURE_SCALE: never,
    Keys.Attention.SHARED_KV_LAYERS: equals(0),
    Keys.Attention.Q_LORA_RANK: equals(0),
    Keys.Attention.KV_LORA_RANK: equals(0),
    Keys.Rope.DIMENSION_SECTIONS: never,
    Keys.Rope.SCALING_ALPHA: equals(0.0),
    Keys.SSM.DT_B_C_RMS: equals(False),
}


def refuse_settings_not_computed(arch) -> None:
    """Refuse the file when it sets a key of `arch.settings_not_computed()` to a value that
    changes the math."""
    for template, neutral in arch.settings_not_computed().items():
        value = arch.gguf.arch_value(template)
        if value is not None and not neutral(value):
            shown = value.tolist() if isinstance(value, np.ndarray) else value
            raise UserError(f"{arch.gguf.path}: {template.format(arch=arch.gguf.architecture)} = {shown} changes "
                            f"the model's math in a way layercycle does not compute for {arch.gguf.architecture}")
