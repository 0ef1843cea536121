"""The biggest open families on tiny random models converted by llama.cpp's converter
(tests/hf_models.py; their logits against transformers', cycled == whole, bfloat16 and
--gpu-layers are in test_architectures.py, within 2e-4 of the logits): each family's special
feature switched off moves the NLL far beyond that tolerance, so the fixtures discriminate;
older deepseek2 files with one attn_kv_b give the same logits; quantized experts equal their
gguf-py dequantization; what llama.cpp does not compute is refused.

Measured max |logits - transformers'|: deepseek2 3.7e-5, its lite variant 2.6e-5, glm4moe 1.4e-5,
mistral3 1.2e-4 (spread evenly over the positions, before and after the temperature starts),
qwen3vl 2.5e-5 and qwen3vlmoe 3.5e-5 (against transformers with the pairs llama.cpp leaves
unrotated unrotated there too: hf_models.unrotate_fourth_axis), gpt-oss 1.6e-4, minimax-m2 1.1e-5, llama4 2.5e-5,
ernie4_5-moe 1.2e-4 (one position; the others within 4e-5), smollm3 1.1e-4, olmo2 1.4e-5,
olmo3 1.4e-5, seed_oss 6.2e-5, qwen2moe 7.3e-5, glm4 3.6e-5, exaone4 7.6e-6 and its 64-layer
(32B-shaped) file 2.0e-5, olmoe 5.1e-5, gemma2 1.1e-5, granite 3.6e-5,
granitemoe 3.5e-5, phi3 5.7e-5, phi3_longrope 1.1e-4,
command-r 2.5e-5, its 64-layer file with Command R+'s QK-norm 7.9e-5, cohere2 2.5e-5, lfm2
3.6e-6, lfm2moe 1.1e-5, granitehybrid 7.8e-5, falcon-h1
2.0e-4 and gemma4 2.4e-4 (test_architectures.ATOL says why), gemma4_moe 5.9e-5, qwen2vl 5.6e-5
(against transformers with llama.cpp's RMSNorms without epsilon: hf_models.rms_eps_unread), apertus
1.6e-5, mamba 5.0e-5, falcon_mamba 3.5e-6, jamba 6.3e-5."""
import math
import re
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, Keys

from pipeline.errors import UserError
from pipeline.gguf_io.reader import GGUFIndex
from pipeline.model.arch import (
    afmoe,
    bailingmoe3,
    blocks,
    cohere,
    deepseek2,
    delta_net,
    exaone4,
    exaone_moe,
    ffn,
    glm5next,
    glm_dsa,
    gpt_oss,
    grok,
    heap_select,
    hunyuan_moe,
    jamba,
    kimi_linear,
    laguna,
    llama4,
    load_architecture,
    minimax01,
    minimax_m3,
    modules,
    muse_glimmer,
    qwen2,
    qwen4exp,
    smollm3,
)
from pipeline.model.arch.family import DecoderArch

from .helpers import forward, random_ids
from .test_architectures import dequantized_twin, random_experts
from .tiny_gguf import rewrite_gguf

# nats: more than 6x what the logits' tolerance in test_architectures.py (2e-4, gpt-oss's 4e-4)
# could move a mean NLL (at most twice the tolerance)
MOVED = 0.005


def nll(path, ids) -> float:
    logits = forward(path, ids)
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten()).item()


def key(template: str, arch: str = "deepseek2") -> str:
    return template.format(arch=arch)


def zeroed(suffix: str | tuple[str, ...]):
    return lambda n, q, d: (np.zeros_like(d), q) if n.endswith(suffix) else (d, q)


def ones(suffix: str | tuple[str, ...]):
    return lambda n, q, d: (np.ones_like(d), q) if n.endswith(suffix) else (d, q)


def dropped(suffix: str | tuple[str, ...]):
    return lambda n, q, d: None if n.endswith(suffix) else (d, q)


def renamed(name: str, new: str):
    return lambda n, q, d: (d, q, new) if n == name else (d, q)


FEATURES_OFF = {   # family fixture, (metadata, tensor transform) of the file with the feature off
    "deepseek2 group limit": ("deepseek2", {key(Keys.LLM.EXPERT_GROUP_COUNT): None,
                                            key(Keys.LLM.EXPERT_GROUP_USED_COUNT): None}, None),
    "deepseek2 YaRN mscale": ("deepseek2", {key(Keys.Rope.SCALING_YARN_LOG_MUL): None}, None),
    "deepseek2 sigmoid routing": ("deepseek2", {key(Keys.LLM.EXPERT_GATING_FUNC): None}, None),
    "deepseek2 weight scale": ("deepseek2", {key(Keys.LLM.EXPERT_WEIGHTS_SCALE): None}, None),
    "deepseek2 selection bias": ("deepseek2", None, zeroed("exp_probs_b.bias")),
    "glm4moe partial RoPE": ("glm4moe", {key(Keys.Rope.DIMENSION_COUNT, "glm4moe"): 16}, None),
    "glm4moe QK-norm": ("glm4moe", None, lambda n, q, d: None if "attn_q_norm" in n or "attn_k_norm" in n else (d, q)),
    "glm4moe sigmoid routing": ("glm4moe", {key(Keys.LLM.EXPERT_GATING_FUNC, "glm4moe"): 1}, None),
    "glm4moe selection bias": ("glm4moe", None, zeroed("exp_probs_b.bias")),
    "glm4moe shared expert": ("glm4moe", {key(Keys.LLM.EXPERT_SHARED_COUNT, "glm4moe"): 0},
                              lambda n, q, d: None if "shexp" in n else (d, q)),
    "bailingmoe2 partial RoPE": ("bailingmoe2", {key(Keys.Rope.DIMENSION_COUNT, "bailingmoe2"): 16}, None),
    "bailingmoe2 QK-norm": ("bailingmoe2", None, dropped(("attn_q_norm.weight", "attn_k_norm.weight"))),
    "bailingmoe2 sigmoid routing": ("bailingmoe2", {key(Keys.LLM.EXPERT_GATING_FUNC, "bailingmoe2"): 1}, None),
    "bailingmoe2 selection bias": ("bailingmoe2", None, zeroed("exp_probs_b.bias")),
    "bailingmoe2 group limit": ("bailingmoe2", {key(Keys.LLM.EXPERT_GROUP_COUNT, "bailingmoe2"): None,
                                                key(Keys.LLM.EXPERT_GROUP_USED_COUNT, "bailingmoe2"): None}, None),
    "bailingmoe2 weight scale": ("bailingmoe2", {key(Keys.LLM.EXPERT_WEIGHTS_SCALE, "bailingmoe2"): None}, None),
    "bailingmoe2 shared expert": ("bailingmoe2", None, zeroed("ffn_down_shexp.weight")),
    "dots1 QK-norm weights": ("dots1", None, ones(("attn_q_norm.weight", "attn_k_norm.weight"))),
    "dots1 sigmoid routing": ("dots1", {key(Keys.LLM.EXPERT_GATING_FUNC, "dots1"): 1}, None),
    "dots1 selection bias": ("dots1", None, zeroed("exp_probs_b.bias")),
    "dots1 group limit": ("dots1", {key(Keys.LLM.EXPERT_GROUP_COUNT, "dots1"): None,
                                    key(Keys.LLM.EXPERT_GROUP_USED_COUNT, "dots1"): None}, None),
    "dots1 weight scale": ("dots1", {key(Keys.LLM.EXPERT_WEIGHTS_SCALE, "dots1"): None}, None),
    "dots1 shared experts": ("dots1", None, zeroed("ffn_down_shexp.weight")),
    "dots3note sliding window": ("dots3note", {key(Keys.Attention.SLIDING_WINDOW, "dots3note"): 1024}, None),
    "dots3note sliding RoPE base": ("dots3note", {key(Keys.Rope.FREQ_BASE_SWA, "dots3note"): 10000.0}, None),
    "dots3note gate per head": ("dots3note", None, zeroed("attn_gate.weight")),
    "dots3note RoPE key norm": ("dots3note", None, ones("attn_k_norm.weight")),
    "dots3note sparse attention": ("dots3note", {key(Keys.Attention.Indexer.TOP_K, "dots3note"): 1024}, None),
    "dots3note selection bias": ("dots3note", None, zeroed("exp_probs_b.bias")),
    "hunyuan-moe shared MLP": ("hunyuan-moe", None, zeroed("ffn_down_shexp.weight")),
    "deci linear attention": ("deci", None, zeroed("blk.1.attn_output.weight")),
    "deci Llama-3 RoPE factors": ("deci", None, ones("rope_freqs.weight")),
    "hy_v3 sigmoid routing": ("hy_v3", {key(Keys.LLM.EXPERT_GATING_FUNC, "hy_v3"): 1}, None),
    "hy_v3 selection bias": ("hy_v3", None, zeroed("exp_probs_b")),
    "hy_v3 weight scale": ("hy_v3", {key(Keys.LLM.EXPERT_WEIGHTS_SCALE, "hy_v3"): None}, None),
    "hy_v3 shared expert": ("hy_v3", None, zeroed("ffn_down_shexp.weight")),
    "hy_v4 sinks": ("hy_v4", None, zeroed("attn_sinks.weight")),
    "hy_v4 gate per value": ("hy_v4", None, zeroed("attn_gate.weight")),
    "hy_v4 sparse attention": ("hy_v4", {key(Keys.Attention.Indexer.TOP_K, "hy_v4"): 1024}, None),
    "hy_v4 experts' SwiGLU clamp": ("hy_v4", {key(Keys.LLM.SWIGLU_CLAMP_EXP, "hy_v4"): None}, None),
    "hy_v4 selection bias": ("hy_v4", None, zeroed("exp_probs_b.bias")),
    "hy_v4 stream output weights": ("hy_v4", None, zeroed("hc_ffn_base.weight")),
    "apertus QK-norm weights": ("apertus", None, ones(("attn_q_norm.weight", "attn_k_norm.weight"))),
    "apertus Llama-3 frequency factors": ("apertus", None, dropped("rope_freqs.weight")),
    # transformers' starting values on every layer (alpha_p, alpha_n 0.8 after softplus, beta 0.5) for the
    # fixture's own per layer
    "apertus xIELU per layer": ("apertus", {"xielu.alpha_p": [0.2034] * 3, "xielu.alpha_n": [-1.0502] * 3,
                                            "xielu.beta": [0.5] * 3}, None),
    "laguna attention gate": ("laguna", None, zeroed("attn_gate.weight")),
    "laguna sliding window": ("laguna", {key(Keys.Attention.SLIDING_WINDOW, "laguna"): 1024}, None),
    "laguna sliding RoPE base": ("laguna", {key(Keys.Rope.FREQ_BASE_SWA, "laguna"): None}, None),
    "laguna sliding layers' rotated width": ("laguna", {key(Keys.Rope.DIMENSION_COUNT_SWA, "laguna"): None}, None),
    "laguna global layers' YaRN": ("laguna", {key(Keys.Rope.SCALING_TYPE, "laguna"): None,
                                              key(Keys.Rope.SCALING_FACTOR, "laguna"): None}, None),
    "laguna sigmoid routing": ("laguna", {key(Keys.LLM.EXPERT_GATING_FUNC, "laguna"): 1}, None),
    "laguna selection bias": ("laguna", None, zeroed("exp_probs_b.bias")),
    "laguna weight scale": ("laguna", {key(Keys.LLM.EXPERT_WEIGHTS_SCALE, "laguna"): None}, None),
    "laguna shared expert": ("laguna", None, zeroed("ffn_down_shexp.weight")),
    "laguna_m1 gate per value": ("laguna_m1", None, zeroed("attn_gate.weight")),
    "grok attention soft-cap": ("grok", {key(Keys.LLM.ATTN_LOGIT_SOFTCAPPING, "grok"): 1e6}, None),
    "grok attention multiplier": ("grok", {key(Keys.Attention.OUTPUT_SCALE, "grok"): None}, None),
    "grok embedding multiplier": ("grok", {key(Keys.LLM.EMBEDDING_SCALE, "grok"): None}, None),
    "grok logit multiplier": ("grok", {key(Keys.LLM.LOGIT_SCALE, "grok"): None}, None),
    "grok post-norms": ("grok", None, ones(("attn_output_norm.weight", "layer_output_norm.weight"))),
    "grok2 post-norms": ("grok2", None, ones(("attn_output_norm.weight", "post_ffw_norm.weight"))),
    "grok2 dense MLP beside the experts": ("grok2", None, zeroed("ffn_down.weight")),
    "grok2 YaRN": ("grok2", {key(Keys.Rope.SCALING_TYPE, "grok"): "none"}, None),
    # the file's beta_fast (8, grok's default too) against the 32 that llama.cpp's other families take
    "grok2 YaRN beta_fast": ("grok2", {key(Keys.Rope.SCALING_YARN_BETA_FAST, "grok"): 32.0}, None),
    "grok2 final soft-cap": ("grok2", {key(Keys.LLM.FINAL_LOGIT_SOFTCAPPING, "grok"): 1e6}, None),
    "exaone-moe QK-norm weights": ("exaone-moe", None, ones(("attn_q_norm.weight", "attn_k_norm.weight"))),
    "exaone-moe sliding window": ("exaone-moe", {key(Keys.Attention.SLIDING_WINDOW, "exaone-moe"): 1024}, None),
    "exaone-moe sigmoid routing": ("exaone-moe", {key(Keys.LLM.EXPERT_GATING_FUNC, "exaone-moe"): 1}, None),
    "exaone-moe selection bias": ("exaone-moe", None, zeroed("exp_probs_b.bias")),
    "exaone-moe group limit": ("exaone-moe", {key(Keys.LLM.EXPERT_GROUP_COUNT, "exaone-moe"): None,
                                              key(Keys.LLM.EXPERT_GROUP_USED_COUNT, "exaone-moe"): None}, None),
    "exaone-moe weight scale": ("exaone-moe", {key(Keys.LLM.EXPERT_WEIGHTS_SCALE, "exaone-moe"): None}, None),
    "exaone-moe shared MLP": ("exaone-moe", None, zeroed("ffn_down_shexp.weight")),
    "muse-glimmer attention gate": ("muse-glimmer", None, zeroed("attn_gate.weight")),
    "muse-glimmer query scale": ("muse-glimmer", None, ones("attn_q_norm.weight")),
    "muse-glimmer sliding window": ("muse-glimmer", {key(Keys.Attention.SLIDING_WINDOW, "muse-glimmer"): 1024}, None),
    "muse-glimmer logit scale": ("muse-glimmer", {key(Keys.LLM.LOGIT_SCALE, "muse-glimmer"): 1.0}, None),
    "muse-glimmer final soft cap": ("muse-glimmer", {key(Keys.LLM.FINAL_LOGIT_SOFTCAPPING, "muse-glimmer"): None},
                                    None),
    "mistral3 attention temperature": ("mistral3", {key(Keys.Attention.TEMPERATURE_SCALE, "mistral3"): None}, None),
    "mistral3 YaRN mscale_all_dim": ("mistral3", {key(Keys.Rope.SCALING_YARN_LOG_MUL, "mistral3"): None}, None),
    "mistral3 YaRN beta_fast": ("mistral3", {key(Keys.Rope.SCALING_YARN_BETA_FAST, "mistral3"): None}, None),
    # no sections: every pair rotated, as transformers does
    "qwen3vl fourth-axis pair": ("qwen3vl", {key(Keys.Rope.DIMENSION_SECTIONS, "qwen3vl"): None}, None),
    "qwen3vlmoe fourth-axis pair": ("qwen3vlmoe", {key(Keys.Rope.DIMENSION_SECTIONS, "qwen3vlmoe"): None}, None),
    "qwen2vl QKV biases": ("qwen2vl", None, zeroed(("attn_q.bias", "attn_k.bias", "attn_v.bias"))),
    # pairs 3 and 7 on the fourth axis (ggml's sectors wrap at the sections' sum), unrotated for text
    "qwen2vl sections": ("qwen2vl", {key(Keys.Rope.DIMENSION_SECTIONS, "qwen2vl"): [1, 1, 1, 1]}, None),
    "gpt-oss sinks": ("gpt-oss", None, lambda n, q, d: (np.full_like(d, -1e4), q) if "attn_sinks" in n else (d, q)),
    "gpt-oss sliding window": ("gpt-oss", {key(Keys.Attention.SLIDING_WINDOW, "gpt-oss"): 1024}, None),
    "gpt-oss expert biases": ("gpt-oss", None, zeroed("_exps.bias")),
    "minimax-m2 partial RoPE": ("minimax-m2", {key(Keys.Rope.DIMENSION_COUNT, "minimax-m2"): 16}, None),
    "minimax-m2 sigmoid routing": ("minimax-m2", {key(Keys.LLM.EXPERT_GATING_FUNC, "minimax-m2"): 1}, None),
    "minimax-m2 selection bias": ("minimax-m2", None, zeroed("exp_probs_b.bias")),
    "ernie4_5-moe selection bias": ("ernie4_5-moe", None, zeroed("exp_probs_b.bias")),
    "ernie4_5-moe shared experts": ("ernie4_5-moe", {key(Keys.LLM.EXPERT_SHARED_COUNT, "ernie4_5-moe"): None},
                                    lambda n, q, d: None if "shexp" in n else (d, q)),
    "gemma2 attention soft-cap": ("gemma2", {key(Keys.LLM.ATTN_LOGIT_SOFTCAPPING, "gemma2"): 1e6}, None),
    "gemma2 final soft-cap": ("gemma2", {key(Keys.LLM.FINAL_LOGIT_SOFTCAPPING, "gemma2"): 1e6}, None),
    "gemma2 sliding window": ("gemma2", {key(Keys.Attention.SLIDING_WINDOW, "gemma2"): 1024}, None),
    "glm4 partial RoPE": ("glm4", {key(Keys.Rope.DIMENSION_COUNT, "glm4"): 16}, None),
    "exaone4_32b sliding window": ("exaone4_32b", {key(Keys.Attention.SLIDING_WINDOW, "exaone4"): 1024}, None),
    "granite embedding multiplier": ("granite", {key(Keys.LLM.EMBEDDING_SCALE, "granite"): None}, None),
    "granite residual multiplier": ("granite", {key(Keys.LLM.RESIDUAL_SCALE, "granite"): None}, None),
    "granite attention multiplier": ("granite", {key(Keys.Attention.SCALE, "granite"): None}, None),
    "granite logit scale": ("granite", {key(Keys.LLM.LOGIT_SCALE, "granite"): 1.0}, None),
    # llama.cpp reads rope.scaling.finetuned = false as no RoPE on any layer (its llama-perplexity
    # gives this file 8185.0648, ours 8185.0637)
    "granite RoPE": ("granite", {key(Keys.Rope.SCALING_FINETUNED, "granite"): False}, None),
    "granitehybrid residual multiplier": ("granitehybrid", {key(Keys.LLM.RESIDUAL_SCALE, "granitehybrid"): None}, None),
    "granitemoe shared expert": ("granitemoe", None, lambda n, q, d: None if "shexp" in n else (d, q)),
    "phi3 partial RoPE": ("phi3", {key(Keys.Rope.DIMENSION_COUNT, "phi3"): 16}, None),
    "phi3_longrope attention factor": ("phi3_longrope", {key(Keys.Rope.SCALING_ATTN_FACTOR, "phi3"): None}, None),
    # an original context of 300: the 256 positions of a run take the short factors (llama-perplexity
    # on this file at ctx 256: 2831.7734, ours 2831.7715; with the long ones 2568.2784 / 2568.2787)
    "phi3_longrope long factors": ("phi3_longrope", {key(Keys.Rope.SCALING_ORIG_CTX_LEN, "phi3"): 300}, None),
    "command-r logit scale": ("command-r", {key(Keys.LLM.LOGIT_SCALE, "command-r"): None}, None),
    "command-r-plus QK-norm": ("command-r-plus", None, dropped(("attn_q_norm.weight", "attn_k_norm.weight"))),
    "cohere2 sliding window": ("cohere2", {key(Keys.Attention.SLIDING_WINDOW, "cohere2"): 1024}, None),
    "lfm2moe sigmoid routing": ("lfm2moe", {key(Keys.LLM.EXPERT_GATING_FUNC, "lfm2moe"): 1}, None),
    "lfm2moe selection bias": ("lfm2moe", None, zeroed("exp_probs_b.bias")),
    "olmo3 sliding window": ("olmo3", {key(Keys.Attention.SLIDING_WINDOW, "olmo2"): 1024}, None),
    "qwen2moe shared expert gate": ("qwen2moe", None, dropped("ffn_gate_inp_shexp.weight")),
    "seed_oss QKV biases": ("seed_oss", None, zeroed(("attn_q.bias", "attn_k.bias", "attn_v.bias"))),
    "mimo2 value scale": ("mimo2", {"mimo2.attention.value_scale": 1.0}, None),
    "mimo2 sinks": ("mimo2", None, lambda n, q, d: (np.full_like(d, -1e4), q) if "attn_sinks" in n else (d, q)),
    "mimo2 sliding window": ("mimo2", {key(Keys.Attention.SLIDING_WINDOW, "mimo2"): 1024}, None),
    "mimo2 selection bias": ("mimo2", None, zeroed("exp_probs_b.bias")),
    "afmoe attention gate": ("afmoe", None, zeroed("attn_gate.weight")),
    "afmoe sliding window": ("afmoe", {key(Keys.Attention.SLIDING_WINDOW, "afmoe"): 1024}, None),
    "afmoe selection bias": ("afmoe", None, zeroed("exp_probs_b.bias")),
    "glm-dsa sparse attention": ("glm-dsa", {key(Keys.Attention.Indexer.TOP_K, "glm-dsa"): 1024}, None),
    "deepseek32 sparse attention": ("deepseek32", {key(Keys.Attention.Indexer.TOP_K, "deepseek32"): 1024}, None),
    "gemma4 per-layer embeddings": ("gemma4", None, zeroed(".proj.weight")),
    "gemma4 layer output scale": ("gemma4", None, ones("layer_output_scale.weight")),
    "gemma4 proportional RoPE": ("gemma4", None, ones("rope_freqs.weight")),
    "gemma4 sliding window": ("gemma4", {key(Keys.Attention.SLIDING_WINDOW, "gemma4"): 1024}, None),
    "gemma4 final soft-cap": ("gemma4", {key(Keys.LLM.FINAL_LOGIT_SOFTCAPPING, "gemma4"): 1e6}, None),
    "gemma4_moe router input scale": ("gemma4_moe", None, ones("ffn_gate_inp.scale")),
    "gemma4_moe expert output scale": ("gemma4_moe", None, ones("ffn_down_exps.scale")),
    "kimi-linear output gate": ("kimi-linear", None, zeroed("ssm_g_b.weight")),
    "kimi-linear selection bias": ("kimi-linear", None, zeroed("exp_probs_b.bias")),
    "kimi-linear weight scale": ("kimi-linear", {key(Keys.LLM.EXPERT_WEIGHTS_SCALE, "kimi-linear"): None}, None),
    "bailingmoe3 KDA output gate": ("bailingmoe3", None, zeroed("ssm_g_a.weight")),
    "bailingmoe3 KDA gate lower bound": ("bailingmoe3", {"bailingmoe3.kda.gate_lower_bound": -30.0}, None),
    "bailingmoe3 MLA gate per head": ("bailingmoe3", None, zeroed("attn_gate.weight")),
    "bailingmoe3 selection bias": ("bailingmoe3", None, zeroed("exp_probs_b.bias")),
    "bailingmoe3 group limit": ("bailingmoe3", {key(Keys.LLM.EXPERT_GROUP_COUNT, "bailingmoe3"): None,
                                                key(Keys.LLM.EXPERT_GROUP_USED_COUNT, "bailingmoe3"): None}, None),
    "bailingmoe3 weights renormalised": ("bailingmoe3", {key(Keys.LLM.EXPERT_WEIGHTS_NORM, "bailingmoe3"): False},
                                         None),
    "bailingmoe3 experts' SwiGLU limit": ("bailingmoe3", {key(Keys.LLM.SWIGLU_CLAMP_EXP, "bailingmoe3"): None}, None),
    "bailingmoe3 shared expert's SwiGLU limit": ("bailingmoe3", {key(Keys.LLM.SWIGLU_CLAMP_SHEXP, "bailingmoe3"):
                                                                 None}, None),
    # (its experts' weights renormalised and scaled, read as the file says, move nothing here: the latent
    # RMSNorm of their weighted sum takes out any factor common to a token's weights)
    "kimi-k3 attention residuals": ("kimi-k3", {"kimi-k3.attn_res.block_size": 0}, dropped("_res_score.weight")),
    "kimi-k3 residuals banked every 2 layers": ("kimi-k3", {"kimi-k3.attn_res.block_size": 4}, None),
    "kimi-k3 final residual mix": ("kimi-k3", None, zeroed("output_res_score.weight")),
    "kimi-k3 KDA safe gate": ("kimi-k3", {"kimi-k3.kda.gate_lower_bound": None}, None),
    "kimi-k3 KDA full-rank output gate": ("kimi-k3", None, zeroed("ssm_g.weight")),
    "kimi-k3 MLA gate per value": ("kimi-k3", None, dropped("attn_gate.weight")),
    "kimi-k3 SiTU beta": ("kimi-k3", {"kimi-k3.activation.situ_beta": 1e4}, None),
    "kimi-k3 SiTU linear beta": ("kimi-k3", {"kimi-k3.activation.situ_linear_beta": 0.0}, None),
    "kimi-k3 latent experts' norm": ("kimi-k3", None, dropped("ffn_routed_norm.weight")),
    "kimi-k3 selection bias": ("kimi-k3", None, zeroed("exp_probs_b.bias")),
    "kimi-k3 shared expert": ("kimi-k3", None, zeroed("ffn_down_shexp.weight")),
    "step35 gate per head": ("step35", None, zeroed("attn_gate.weight")),
    "step35 sliding window": ("step35", {key(Keys.Attention.SLIDING_WINDOW, "step35"): 1024}, None),
    "step35 sliding RoPE base": ("step35", {key(Keys.Rope.FREQ_BASE_SWA, "step35"): None}, None),
    "step35 sliding layers' rotated width": ("step35", {"step35.rope.dimension_count_swa": 8}, None),
    "step35 experts' SwiGLU limit": ("step35", {key(Keys.LLM.SWIGLU_CLAMP_EXP, "step35"): None}, None),
    "step35 shared expert's SwiGLU limit": ("step35", {key(Keys.LLM.SWIGLU_CLAMP_SHEXP, "step35"): None}, None),
    "minimax-m3 sparse attention": ("minimax-m3", {"minimax-m3.attention.indexer.top_k": 1024}, None),
    "minimax-m3 local block first": ("minimax-m3", {"minimax-m3.attention.indexer.local_blocks": 0}, None),
    "minimax-m3 block size": ("minimax-m3", {"minimax-m3.attention.indexer.block_size": 8}, None),
    "minimax-01 residual scale": ("minimax-01", {key(Keys.LLM.RESIDUAL_SCALE, "minimax-01"): 1.0}, None),
    "minimax-01 lightning output gate": ("minimax-01", None, zeroed("attn_gate.weight")),
    "minimax-01 lightning output norm": ("minimax-01", None, ones("attn_norm_2.weight")),
    "minimax-01 partial RoPE": ("minimax-01", {key(Keys.Rope.DIMENSION_COUNT, "minimax-01"): 8}, None),
    "qwen4exp sparse attention": ("qwen4exp", {"qwen4exp.attention.indexer.top_k": 1024}, None),
    "qwen4exp block size": ("qwen4exp", {"qwen4exp.attention.compress_ratios": [0, 2, 0, 2]}, None),
    "qwen4exp n-gram embedding": ("qwen4exp", None, zeroed("ple_value.weight")),
    "qwen4exp hyper-connection write-back": ("qwen4exp", None, zeroed(("hc_attn_inject.weight",
                                                                       "hc_ffn_inject.weight"))),
    "glm5next hyper-connection mixing": ("glm5next", None, zeroed(("hc_attn_fn.weight", "hc_ffn_fn.weight"))),
    "glm5next Sinkhorn iterations": ("glm5next", {"glm5-next.hyper_connection.sinkhorn_iterations": 1}, None),
    "glm5next KDA safe gate": ("glm5next", {"glm5-next.kda.gate_lower_bound": None}, None),
    "glm5next KDA output gate": ("glm5next", None, zeroed("ssm_g_b.weight")),
    "glm5next sparse attention": ("glm5next", {key(Keys.Attention.Indexer.TOP_K, "glm5-next"): 1024}, None),
    "glm5next incomplete pool selected": ("glm5next", {"glm5-next.attention.indexer.kpool_select_tail": False},
                                          None),
    "glm5next pool positions": ("glm5next", None, zeroed("indexer_compressor_ape.weight")),
    "glm5next indexer key norm bias": ("glm5next", None, zeroed("indexer.k_norm.bias")),
    "glm5next SwiGLU limits": ("glm5next", {key(Keys.LLM.SWIGLU_CLAMP_EXP, "glm5-next"): None,
                                            key(Keys.LLM.SWIGLU_CLAMP_SHEXP, "glm5-next"): None}, None),
    "glm5next selection bias": ("glm5next", None, zeroed("exp_probs_b.bias")),
    "glm5next weight scale": ("glm5next", {key(Keys.LLM.EXPERT_WEIGHTS_SCALE, "glm5-next"): None}, None),
    "glm5next weights renormalised": ("glm5next", {key(Keys.LLM.EXPERT_WEIGHTS_NORM, "glm5-next"): False}, None),
    "glm5next shared expert": ("glm5next", None, zeroed("ffn_down_shexp.weight")),
    # Falcon-Mamba's weightless RMSNorms of dt, B and C (llama-perplexity on this file: 3419.6380, ours
    # 3419.6381)
    "falcon_mamba dt, B and C norms": ("falcon_mamba", {key(Keys.SSM.DT_B_C_RMS, "mamba"): False}, None),
    "jamba dt, B and C norm weights": ("jamba", None, ones(("ssm_dt_norm.weight", "ssm_b_norm.weight",
                                                            "ssm_c_norm.weight"))),
}


@pytest.mark.parametrize("feature", FEATURES_OFF)
def test_each_special_feature_moves_the_nll(feature, tiny_model, tmp_path):
    name, metadata, transform = FEATURES_OFF[feature]
    _, path = tiny_model(name)
    changed = rewrite_gguf(path, tmp_path / "changed.gguf", transform, metadata=metadata)
    ids = random_ids()
    assert abs(nll(path, ids) - nll(changed, ids)) > MOVED


KIMI_LAYER_SPEC = kimi_linear.KimiLinear.layer_spec
BAILING3_LAYER_SPEC = bailingmoe3.BailingMoe3.layer_spec
SELECT_KEYS = heap_select.select_keys


def rotated(spec, rope):
    """A layer's spec with its attention (if any) under `rope`."""
    return spec if spec.attention is None else replace(spec, attention=replace(spec.attention, rope=rope))


# features no metadata switches off: the code that computes them is patched out
PATCHED_OFF = {   # family fixture, (module or class, attribute, stand-in)
    "afmoe NoPE global layers": ("afmoe", afmoe, "NO_ROPE_STEP", 1000),
    "laguna softplus gate": ("laguna", laguna.SoftplusGatedAttention, "own_gate", staticmethod(torch.sigmoid)),
    "laguna first layer of four global": ("laguna", laguna.Laguna, "swa_dense_first", False),
    "cohere2moe shared experts averaged": ("cohere2moe", cohere.AveragedSharedMoE, "finish", ffn.MoE.finish),
    "cohere2moe RoPE on the dense prefix": ("cohere2moe", cohere.Cohere2Moe, "attention_spec",
                                            cohere.Cohere2.attention_spec),
    "glm-dsa indexer RoPE on consecutive pairs": ("glm-dsa", glm_dsa.GlmDsa, "index_rope",
                                                   property(lambda self: replace(self.trunk_rope, neox=True))),
    "deepseek2 decoupled RoPE": ("deepseek2", deepseek2, "apply_rope", lambda x, cos, sin, spec: x),
    "gpt-oss SwiGLU clamp": ("gpt-oss", gpt_oss, "swiglu_oai",
                             lambda gate, up: ffn.swiglu_oai(gate, up, limit=math.inf)),
    "qwen2vl RoPE half the width apart": ("qwen2vl", qwen2.Qwen2VL, "neox_rope", False),
    "llama4 NoPE layers": ("llama4", llama4.Llama4, "uses_rope", lambda self, i: True),
    "llama4 QK L2-norm": ("llama4", llama4, "MAVERICK_EXPERTS", 4),
    "llama4 weight before the expert": ("llama4", llama4.Llama4, "weight_before_experts", False),
    "qwen2moe weights not renormalised": ("qwen2moe", qwen2.Qwen2Moe, "normalizes_expert_weights", lambda self: True),
    # Grok-1's renormalised weights only scale the experts' sum, which the post-FFN norm undoes; Grok-2's
    # dense MLP beside them does not (nor does its sum's sqrt(2) / 2, undone likewise, have a row)
    "grok2 top-k weights renormalised": ("grok2", grok.Grok, "normalizes_expert_weights", lambda self: False),
    "exaone4_32b NoPE global layers": ("exaone4_32b", exaone4.Exaone4, "attention_spec",
                                       lambda self, i: replace(exaone4.DecoderArch.attention_spec(self, i),
                                                               span=None if not self.is_sliding(i) else 32)),
    "exaone-moe NoPE global layers": ("exaone-moe", exaone_moe.ExaoneMoe, "attention_spec",
                                      lambda self, i: replace(exaone_moe.DecoderArch.attention_spec(self, i),
                                                              span=None if not self.is_sliding(i) else 32)),
    "muse-glimmer NoPE global layers": ("muse-glimmer", muse_glimmer.MuseGlimmer, "attention_spec",
                                        lambda self, i: replace(muse_glimmer.DecoderArch.attention_spec(self, i),
                                                                span=None if not self.is_sliding(i) else 32)),
    "muse-glimmer embedding norm": ("muse-glimmer", muse_glimmer.MuseGlimmer, "embed", muse_glimmer.DecoderArch.embed),
    "muse-glimmer norms after the blocks": ("muse-glimmer", muse_glimmer.FinePostNormLayer, "post_norm",
                                            lambda self, x, weight: x),
    "olmoe weights not renormalised": ("olmoe", qwen2.Qwen2Moe, "normalizes_expert_weights", lambda self: True),
    "smollm3 NoPE layers": ("smollm3", smollm3, "NOPE_PERIOD", 10 ** 6),
    "olmo2 norms after the blocks": ("olmo2", modules.PostNormLayer, "norm", lambda self, x, weight: x),
    # KDA's decay per key channel, against one per head (Gated DeltaNet's) of the channels' mean
    "kimi-linear decay per key channel": ("kimi-linear", kimi_linear, "delta_rule_blockwise",
                                          lambda q, k, v, g, *rest: delta_net.delta_rule_blockwise(
                                              q, k, v, g.mean(-1), *rest)),
    # its latent-attention layers rotate no key part (llama-perplexity agrees: ARCHITECTURES.md)
    "kimi-linear latent attention without RoPE": ("kimi-linear", kimi_linear.KimiLinear, "layer_spec",
                                                  lambda self, i: rotated(KIMI_LAYER_SPEC(self, i), self.trunk_rope)),
    # its latent-attention layers rotate the key part on consecutive pairs, where kimi-linear's rotate none
    "bailingmoe3 latent attention RoPE": ("bailingmoe3", bailingmoe3.BailingMoe3, "layer_spec",
                                          lambda self, i: rotated(BAILING3_LAYER_SPEC(self, i), None)),
    "jamba weights not renormalised": ("jamba", jamba.Jamba, "normalizes_expert_weights", lambda self: True),
    "jamba attention without RoPE": ("jamba", jamba.Jamba, "attention_spec",
                                     lambda self, i: DecoderArch.attention_spec(self, i)),
    # lightning attention without its decay (plain linear attention), or with every layer's decay the first's
    "minimax-01 lightning decay": ("minimax-01", minimax01, "alibi_slopes", lambda n_head: torch.zeros(n_head)),
    "minimax-01 decay slowing with depth": ("minimax-01", minimax01.Minimax01, "slope_scale", lambda self, i: 1.0),
    # llama's residual: the stream itself, not each block's normed input, joins the block's output
    "minimax-01 residual from the normed input": ("minimax-01", minimax01.NormResidualLayer, "forward",
                                                  modules.PreNormLayer.forward),
    "minimax-m3 clamped SwiGLU": ("minimax-m3", minimax_m3.MinimaxM3, "gated_unit", lambda self, i, shared=False: None),
    "qwen4exp Gated DeltaNet's sigmoid output gate": ("qwen4exp", qwen4exp.Qwen4Exp, "delta_net_gate",
                                                      staticmethod(F.silu)),
    # the head reads the first stream, not the streams' mean
    "glm5next mean of the streams": ("glm5next", glm5next.StreamMean, "forward",
                                     lambda self, streams: (streams[..., 0, :],)),
    # whole blocks only, as transformers selects: the tail's spare slots left empty
    "qwen4exp spare slots to the next-best block": ("qwen4exp", heap_select, "select_keys",
                                                    lambda scores, ratio, width, selected: SELECT_KEYS(
                                                        scores, ratio, width - ratio + 1, selected)),
}


@pytest.mark.parametrize("feature", PATCHED_OFF)
def test_each_feature_without_a_switch_moves_the_nll(feature, tiny_model, monkeypatch):
    name, target, attribute, stand_in = PATCHED_OFF[feature]
    _, path = tiny_model(name)
    ids = random_ids()
    computed = nll(path, ids)
    monkeypatch.setattr(target, attribute, stand_in)
    assert abs(computed - nll(path, ids)) > MOVED


def test_hunyuan_moe_norms_queries_and_keys_after_rope(tiny_model, monkeypatch):
    """RoPE keeps each head's RMS, so normalising after it differs from before it only by where the
    norm's weights fall: the logits move by up to 8, the NLL on random ids by 0.004 (below MOVED)."""
    _, path = tiny_model("hunyuan-moe")
    ids = random_ids()
    after = forward(path, ids)
    monkeypatch.setattr(hunyuan_moe.HunyuanMoe, "attention", lambda self, spec, t: blocks.Attention(
        self.attention_weights(spec, t), spec, self.hp.eps))     # qwen3's: QK-norm before RoPE
    assert (forward(path, ids) - after).abs().max().item() > 1.0


def joined_kv_b(src, dst):
    """The file as older converters wrote it: per head, the K decompression (transposed back)
    then the V one in one attn_kv_b [heads x (nope + value), rank]; head sizes as MHA's."""
    reader = GGUFReader(str(src))
    data = {t.name: np.asarray(t.data) for t in reader.tensors}

    def join(name, qtype, d):
        if name.endswith("attn_v_b.weight"):
            return None
        if name.endswith("attn_k_b.weight"):
            k_b, v_b = d, data[name.replace("attn_k_b", "attn_v_b")]          # [H, rank, nope], [H, value, rank]
            kv_b = np.concatenate([k_b.transpose(0, 2, 1), v_b], axis=1)        # [H, nope + value, rank]
            return kv_b.reshape(-1, kv_b.shape[-1]), qtype, name.replace("attn_k_b", "attn_kv_b")
        return d, qtype
    index = GGUFIndex(src)
    mla_k, mla_v = index.arch_value(Keys.Attention.KEY_LENGTH_MLA), index.arch_value(Keys.Attention.VALUE_LENGTH_MLA)
    return rewrite_gguf(src, dst, join, metadata={
        key(Keys.Attention.KEY_LENGTH_MLA): None, key(Keys.Attention.VALUE_LENGTH_MLA): None,
        key(Keys.Attention.KEY_LENGTH): int(mla_k), key(Keys.Attention.VALUE_LENGTH): int(mla_v),
        key(Keys.Attention.HEAD_COUNT_KV): int(index.arch_value(Keys.Attention.HEAD_COUNT))})


def test_a_joined_attn_kv_b_gives_the_split_files_logits(tiny_model, tmp_path):
    model, path = tiny_model("deepseek2")
    older = joined_kv_b(path, tmp_path / "kv_b.gguf")
    assert "blk.0.attn_kv_b.weight" in GGUFIndex(older).tensors
    ids = random_ids()
    with torch.no_grad():
        ref = model(ids).logits
    assert (forward(older, ids) - forward(path, ids)).abs().max().item() < 1e-5
    assert (forward(older, ids) - ref).abs().max().item() < 2e-4


def test_sink_attention_in_blocks_of_queries_gives_the_same_logits(tiny_model, monkeypatch):
    # 7 queries a block (the default holds all 150 at once here): the sliding window's mask,
    # the causal one and the keys cut at each block's end must give the one-block logits
    _, path = tiny_model("gpt-oss")
    ids = random_ids()
    whole = forward(path, ids)
    monkeypatch.setattr(blocks, "SCORE_BLOCK_BYTES", 3 * 4 * 2 * 4 * 150 * 7)
    torch.testing.assert_close(forward(path, ids), whole, rtol=0, atol=1e-4)   # rounding: measured 1.8e-5


@pytest.mark.parametrize("name", ["deepseek2", "glm4moe", "step35"])
def test_multi_token_prediction_blocks_are_not_run(name, tiny_model, tmp_path):
    # a NextN block after the trunk, as converters append it: a copy of the last layer plus the
    # nextn projections, all NaN, so that running any of it would show
    _, path = tiny_model(name)
    arch = load_architecture(GGUFIndex(path))
    n, hidden = arch.hp.n_layers, arch.hp.hidden
    last = {t.name: t for t in GGUFReader(str(path)).tensors if t.name.startswith(f"blk.{n - 1}.")}
    nan = {name.replace(f"blk.{n - 1}.", f"blk.{n}."): (np.full_like(np.asarray(t.data), np.nan), t.tensor_type)
           for name, t in last.items()}
    nan |= {f"blk.{n}.nextn.eh_proj.weight": (np.full((hidden, 2 * hidden), np.nan, np.float32), Q.F32),
            f"blk.{n}.nextn.enorm.weight": (np.full(hidden, np.nan, np.float32), Q.F32),
            f"blk.{n}.nextn.hnorm.weight": (np.full(hidden, np.nan, np.float32), Q.F32)}
    with_mtp = rewrite_gguf(path, tmp_path / "mtp.gguf", extra=nan, metadata={
        key(Keys.LLM.BLOCK_COUNT, name): n + 1, key(Keys.LLM.NEXTN_PREDICT_LAYERS, name): 1})
    assert load_architecture(GGUFIndex(with_mtp)).hp.n_layers == n
    ids = random_ids()
    assert torch.equal(forward(with_mtp, ids), forward(path, ids))


@pytest.mark.parametrize("name,qtype", [("deepseek2_wide", Q.Q4_K), ("gpt-oss", Q.MXFP4)])
def test_quantized_experts_equal_their_gguf_py_dequantization(name, qtype, tiny_model, tmp_path):
    _, path = tiny_model(name)
    quantized = random_experts(path, tmp_path / "quantized.gguf", qtype)
    assert GGUFIndex(quantized).tensors["blk.1.ffn_down_exps.weight"].qtype == qtype
    ids = random_ids()
    logits = forward(quantized, ids)
    assert torch.isfinite(logits).all() and not torch.equal(logits, forward(path, ids))
    assert torch.equal(logits, forward(dequantized_twin(quantized, tmp_path / "twin.gguf"), ids))


def older_kv_b(name, qtype, d):
    """An attn_kv_b [heads x (nope + value), rank] in place of attn_k_b and attn_v_b, its rows the
    K decompression twice (what it holds does not matter: the file is refused before any work)."""
    if name.endswith("attn_v_b.weight"):
        return None
    if name.endswith("attn_k_b.weight"):
        k = d.transpose(0, 2, 1)                                                   # [H, nope, rank]
        return np.concatenate([k, k], axis=1).reshape(-1, d.shape[1]), qtype, name.replace("attn_k_b", "attn_kv_b")
    return d, qtype


def narrower_heads(name, qtype, d):
    """Heads of 8 in place of 16: Q and K, V of half their rows, the output projection of half its columns."""
    if name.endswith(("attn_q.weight", "attn_k.weight", "attn_v.weight")):
        return np.ascontiguousarray(d[:d.shape[0] // 2]), qtype
    if name.endswith("attn_output.weight"):
        return np.ascontiguousarray(d[:, :d.shape[1] // 2]), qtype
    return d, qtype
def fused_qkv(block: str):
    """One attn_qkv in place of the block's attn_q, attn_k and attn_v (its rows Q's thrice: the file is
    refused before any work)."""
    def fuse(name, qtype, d):
        if name in (block + "attn_k.weight", block + "attn_v.weight"):
            return None
        if name == block + "attn_q.weight":
            return np.concatenate([d, d, d]), qtype, block + "attn_qkv.weight"
        return d, qtype
    return fuse


@pytest.mark.parametrize("name,metadata,transform,message", [
    ("deepseek2", {key(Keys.LLM.EXPERT_GATING_FUNC): 3}, None, "expert_gating_func 3 is not computed"),
    ("deepseek2", {key(Keys.Attention.TEMPERATURE_SCALE): 0.5}, None,
     "temperature_scale = 0.5 changes the model's math"),
    ("deepseek2", {key(Keys.Attention.KV_LORA_RANK): 16}, None,
     "blk.0.attn_kv_a_mqa.weight is [40, 64] where the metadata"),
    ("deepseek2", None, dropped("blk.2.attn_q_b.weight"), "missing tensor blk.2.attn_q_b"),
    # llama.cpp stops on a MiniMax-M2 file that names no gating function
    ("minimax-m2", {key(Keys.LLM.EXPERT_GATING_FUNC, "minimax-m2"): None}, None,
     "missing metadata key minimax-m2.expert_gating_func"),
    ("gpt-oss", None, dropped("blk.1.attn_sinks.weight"), "missing tensor blk.1.attn_sinks.weight"),
    ("gpt-oss", {key(Keys.LLM.EXPERT_GATING_FUNC, "gpt-oss"): 1}, None, "expert_gating_func = 1 changes"),
    # Granite 4 Vision feeds image features into layers: not computed
    ("granite", {"granite.deepstack_mapping": [-1, 0, -1]}, None, "deepstack_mapping = [-1, 0, -1] changes"),
    # llama.cpp never renormalises qwen2moe's top-k weights
    ("qwen2moe", {key(Keys.LLM.EXPERT_WEIGHTS_NORM, "qwen2moe"): True}, None, "expert_weights_norm = True changes"),
    # and always renormalises kimi-linear's; it stops on a file that names no gating function
    ("kimi-linear", {key(Keys.LLM.EXPERT_WEIGHTS_NORM, "kimi-linear"): False}, None,
     "expert_weights_norm = False changes"),
    ("kimi-linear", {key(Keys.LLM.EXPERT_GATING_FUNC, "kimi-linear"): None}, None,
     "missing metadata key kimi-linear.expert_gating_func"),
    ("kimi-linear", {key(Keys.SSM.CONV_KERNEL, "kimi-linear"): 3}, None,
     "blk.0.ssm_conv1d_q.weight is [1, 64, 1, 4] where the metadata gives [64, 3]"),
    # MiniMax Sparse Attention gives each KV group one indexer head; llama.cpp asserts it
    ("minimax-m3", {key(Keys.Attention.Indexer.HEAD_COUNT, "minimax-m3"): 4}, None,
     "4 indexer heads for 2 KV heads"),
    ("minimax-m3", {key(Keys.LLM.EXPERT_GATING_FUNC, "minimax-m3"): None}, None,
     "missing metadata key minimax-m3.expert_gating_func"),
    # llama.cpp stops on a Ling 2.0 file that names no gating function, has no LM head of its own (no
    # tied head; attention biases: test_bailingmoe2.py); it sizes the shared experts as
    # expert_shared_count times the key that converters write as their total
    ("bailingmoe2", {key(Keys.LLM.EXPERT_GATING_FUNC, "bailingmoe2"): None}, None,
     "missing metadata key bailingmoe2.expert_gating_func"),
    ("bailingmoe2", None, lambda n, q, d: None if n == "output.weight" else (d, q), "missing tensor output.weight"),
    ("bailingmoe2", {key(Keys.LLM.EXPERT_SHARED_COUNT, "bailingmoe2"): 2}, None, "expert_shared_count = 2 changes"),
    # llama.cpp asserts bailingmoe3's safe KDA gate and a negative lower bound, stops on a file without
    # the bound, the gating function or a latent layer's head gate, loads K_b and V_b apart only; a
    # vision-language file's rope sections make its RoPE multi-axis (MROPE), not computed
    ("bailingmoe3", {"bailingmoe3.kda.safe_gate": False}, None, "bailingmoe3.kda.safe_gate is false"),
    ("bailingmoe3", {"bailingmoe3.kda.gate_lower_bound": 0.0}, None, "bailingmoe3.kda.gate_lower_bound is 0"),
    ("bailingmoe3", {"bailingmoe3.kda.gate_lower_bound": None}, None,
     "missing metadata key bailingmoe3.kda.gate_lower_bound"),
    ("bailingmoe3", {key(Keys.LLM.EXPERT_GATING_FUNC, "bailingmoe3"): None}, None,
     "missing metadata key bailingmoe3.expert_gating_func"),
    ("bailingmoe3", None, dropped("blk.1.attn_gate.weight"), "missing tensor blk.1.attn_gate.weight"),
    ("bailingmoe3", None, older_kv_b, "tensor blk.1.attn_kv_b.weight: llama.cpp's bailingmoe3 loader takes attn_k_b"),
    ("bailingmoe3", {key(Keys.Rope.DIMENSION_SECTIONS, "bailingmoe3"): [2, 1, 1, 0]}, None,
     "rope.dimension_sections = [2, 1, 1, 0] changes"),
    # llama.cpp stops on a dots1 file without a gating function, its own LM head or a QK-norm; on a
    # dots3note file whose indexer types are not its full layers or without a head gate; RoPE scaling
    # on dots3note is not computed (llama.cpp would; no published file has it)
    ("dots1", {key(Keys.LLM.EXPERT_GATING_FUNC, "dots1"): None}, None, "missing metadata key dots1.expert_gating_func"),
    ("dots1", None, lambda n, q, d: None if n == "output.weight" else (d, q), "missing tensor output.weight"),
    ("dots1", None, dropped("blk.1.attn_q_norm.weight"), "missing tensor blk.1.attn_q_norm.weight"),
    ("dots3note", {"dots3note.attention.indexer.types": [True] * 4}, None, "layer 1 is sliding but"),
    ("dots3note", {key(Keys.LLM.EXPERT_GATING_FUNC, "dots3note"): None}, None,
     "missing metadata key dots3note.expert_gating_func"),
    ("dots3note", None, dropped("blk.2.attn_gate.weight"), "blk.2.attn_gate.weight"),
    ("dots3note", {key(Keys.Rope.SCALING_TYPE, "dots3note"): "linear", key(Keys.Rope.SCALING_FACTOR, "dots3note"): 2.0},
     None, "RoPE scaling is not computed by layercycle for dots3note"),
    # llama.cpp's grok graph asserts RoPE over whole heads, its loader requires expert_count (it throws on
    # none), a router on every layer, Q and the output projection as wide as the stream, the dense MLP
    # feed_forward_length wide and the experts expert_feed_forward_length; a yarn_ext_factor of 0 under
    # YaRN (the file's attention factor kept) or one above 0 under linear scaling (YaRN's angles mixed
    # in) is not computed
    ("grok", {key(Keys.Rope.DIMENSION_COUNT, "grok"): 8}, None, "grok rotates whole heads of one size"),
    ("grok", {key(Keys.LLM.EXPERT_COUNT, "grok"): None}, None, "missing metadata key grok.expert_count"),
    ("grok", None, dropped("blk.1.ffn_gate_inp.weight"), "missing tensor blk.1.ffn_gate_inp.weight"),
    ("grok", {key(Keys.Attention.KEY_LENGTH, "grok"): 8, key(Keys.Attention.VALUE_LENGTH, "grok"): 8},
     narrower_heads, "4 heads of 8 are not the embedding_length 64"),
    ("grok2", {key(Keys.LLM.FEED_FORWARD_LENGTH, "grok"): 64}, None,
     "tensor blk.0.ffn_up.weight is [96, 64] where the metadata gives [64, 64]"),
    ("grok2", {key(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, "grok"): 16}, None, "experts 16 wide"),
    ("grok2", {key(Keys.Rope.SCALING_YARN_EXT_FACTOR, "grok"): 0.0}, None,
     "yarn_ext_factor 0 under yarn RoPE scaling is not computed"),
    ("grok", {key(Keys.Rope.SCALING_TYPE, "grok"): "linear", key(Keys.Rope.SCALING_FACTOR, "grok"): 2.0,
              key(Keys.Rope.SCALING_YARN_EXT_FACTOR, "grok"): 1.0}, None,
     "yarn_ext_factor 1 under linear RoPE scaling is not computed"),
    # llama.cpp routes hunyuan-moe by softmax whatever the file says (a file that says otherwise is
    # refused); it leaves a hy_v3 selection bias named with a `.bias` suffix unread; it stops on a
    # hy_v4 file without a gating function or whose layer 0 does not run the indexer
    ("hunyuan-moe", {key(Keys.LLM.EXPERT_GATING_FUNC, "hunyuan-moe"): 2}, None, "expert_gating_func = 2 changes"),
    ("hy_v3", None, lambda n, q, d: (d, q, n + ".bias") if n.endswith("exp_probs_b") else (d, q),
     "tensor blk.1.exp_probs_b.bias is not part of the hy_v3 layer"),
    ("hy_v4", {key(Keys.LLM.EXPERT_GATING_FUNC, "hy_v4"): None}, None, "missing metadata key hy_v4.expert_gating_func"),
    ("hy_v4", {"hy_v4.attention.indexer.types": [False, True, False, True]}, None, "layer 0"),
    # llama.cpp's deci graph drops the output of a layer with attention but no feed-forward block, takes
    # the head size from layer 0 (none where it has no heads), and rotates whole heads
    ("deci", {key(Keys.LLM.FEED_FORWARD_LENGTH, "deci"): [256, 0, 0, 512, 256]}, None,
     "layer 1 has attention but no feed-forward block"),
    ("deci", {key(Keys.Attention.HEAD_COUNT, "deci"): [0, 4, 0, 0, 4],
              key(Keys.Attention.HEAD_COUNT_KV, "deci"): [0, 0, 0, 0, 1]}, None, "layer 0 has no attention heads"),
    ("deci", {key(Keys.Rope.DIMENSION_COUNT, "deci"): 8}, None, "rope dimension count 8"),
    # llama.cpp's qwen2vl loader requires the RoPE sections (ggml a pair on one of the first three axes)
    # and a gated MLP, takes no attention output bias and loads an output bias its graph leaves unused
    ("qwen2vl", {key(Keys.Rope.DIMENSION_SECTIONS, "qwen2vl"): None}, None,
     "missing metadata key qwen2vl.rope.dimension_sections"),
    ("qwen2vl", {key(Keys.Rope.DIMENSION_SECTIONS, "qwen2vl"): [0, 0, 0, 8]}, None, "none of the first three axes"),
    ("qwen2vl", None, dropped("blk.1.ffn_gate.weight"), "missing tensor blk.1.ffn_gate.weight"),
    ("qwen2vl", None, renamed("blk.0.attn_q.bias", "blk.0.attn_output.bias"),
     "tensor blk.0.attn_output.bias is not part of llama.cpp's qwen2vl graph"),
    ("qwen2vl", None, renamed("blk.0.attn_q.bias", "output.bias"), "tensor output.bias is not part of"),
    ("qwen2vl", {key(Keys.Rope.DIMENSION_COUNT, "qwen2vl"): 8}, None, "rope dimension count 8"),
    # llama.cpp's apertus loader requires the four xIELU keys (one value, or one per layer), the QK-norms and
    # the LM head; it loads QK-norm biases its graph leaves unused, takes no output bias; it computes LongRoPE
    ("apertus", {"xielu.eps": None}, None, "missing metadata key xielu.eps"),
    ("apertus", {"xielu.beta": [0.5, 0.5]}, None, "xielu.beta has 2 values for 3 layers"),
    ("apertus", None, dropped("blk.1.attn_k_norm.weight"), "missing tensor blk.1.attn_k_norm.weight"),
    ("apertus", None, lambda n, q, d: None if n == "output.weight" else (d, q), "missing tensor output.weight"),
    ("apertus", None, renamed("rope_freqs.weight", "blk.2.attn_q_norm.bias"),
     "tensor blk.2.attn_q_norm.bias is not part of llama.cpp's apertus graph"),
    ("apertus", None, renamed("rope_freqs.weight", "output.bias"), "tensor output.bias is not part of"),
    ("apertus", {key(Keys.Rope.SCALING_TYPE, "apertus"): "longrope"}, None, "'longrope' is not computed"),
    # llama.cpp's laguna loader requires the gate (one per head or per value: it aborts on another
    # width), the selection bias, the leading dense count and the experts' width, and loads no
    # output bias; its graph gives every layer layer 0's head size
    ("laguna", None, dropped("blk.1.attn_gate.weight"), "missing tensor blk.1.attn_gate.weight"),
    ("laguna", None, lambda n, q, d: (d[:2], q) if n == "blk.0.attn_gate.weight" else (d, q),
     "tensor blk.0.attn_gate.weight is [2, 64] where the metadata gives [4, 64]"),
    ("laguna", None, dropped("blk.2.exp_probs_b.bias"), "missing tensor blk.2.exp_probs_b.bias"),
    ("laguna", {key(Keys.LLM.LEADING_DENSE_BLOCK_COUNT, "laguna"): None}, None,
     "missing metadata key laguna.leading_dense_block_count"),
    ("laguna", {key(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, "laguna"): None}, None,
     "missing metadata key laguna.expert_feed_forward_length"),
    ("laguna", None, lambda n, q, d: (d, q, "blk.0.attn_output.bias") if n == "blk.0.attn_norm.weight" else (d, q),
     "tensor blk.0.attn_output.bias is not part of the laguna layer llama.cpp loads"),
    ("laguna", {key(Keys.Attention.KEY_LENGTH_SWA, "laguna"): 8}, None, "laguna.attention.key_length_swa is not"),
    # llama.cpp's Mamba-1 takes an expansion factor of 2 only, requires the scan's keys and the
    # convolution's bias; its jamba graph never renormalises the top-k weights, reads no weight scale,
    # and its loader requires the dense MLP's gate and the mixers' norms
    ("mamba", {key(Keys.SSM.INNER_SIZE, "mamba"): 192}, None, "ssm.inner_size 192 is not twice embedding_length 64"),
    ("mamba", {key(Keys.SSM.TIME_STEP_RANK, "mamba"): None}, None, "missing metadata key mamba.ssm.time_step_rank"),
    ("mamba", None, dropped("blk.1.ssm_conv1d.bias"), "missing tensor blk.1.ssm_conv1d.bias"),
    ("jamba", {key(Keys.LLM.EXPERT_WEIGHTS_NORM, "jamba"): True}, None, "expert_weights_norm = True changes"),
    ("jamba", {key(Keys.LLM.EXPERT_WEIGHTS_SCALE, "jamba"): 2.0}, None, "expert_weights_scale = 2.0 changes"),
    ("jamba", None, dropped("blk.0.ffn_gate.weight"), "missing tensor blk.0.ffn_gate.weight"),
    ("jamba", None, dropped("blk.3.ssm_b_norm.weight"), "missing tensor blk.3.ssm_b_norm.weight"),
    # llama.cpp requires minimax-01's residual scale, routes by softmax and renormalises whatever the file
    # says, creates no tensors past the trunk, asserts values as wide as keys, reads which layers attend
    # from the file (a layer with the other kind's tensors is refused) and divides the decay by
    # block_count - 1; one head count for every layer and the tensors it creates: the tests below
    ("minimax-01", {key(Keys.LLM.RESIDUAL_SCALE, "minimax-01"): None}, None,
     "missing metadata key minimax-01.residual_scale"),
    ("minimax-01", {key(Keys.LLM.EXPERT_GATING_FUNC, "minimax-01"): 2}, None, "expert_gating_func = 2 changes"),
    ("minimax-01", {key(Keys.LLM.EXPERT_WEIGHTS_NORM, "minimax-01"): False}, None,
     "expert_weights_norm = False changes"),
    ("minimax-01", {key(Keys.LLM.NEXTN_PREDICT_LAYERS, "minimax-01"): 1}, None, "nextn_predict_layers = 1 changes"),
    ("minimax-01", {key(Keys.Attention.VALUE_LENGTH, "minimax-01"): 8}, None, "value_length 8 is not key_length 16"),
    ("minimax-01", {key(Keys.LLM.FULL_ATTENTION_INTERVAL, "minimax-01"): 4}, None,
     "blk.3.attn_qkv.weight is [192, 64] where the metadata gives [128, 64]"),
    ("minimax-01", {key(Keys.LLM.FULL_ATTENTION_INTERVAL, "minimax-01"): 0}, None,
     "minimax-01.full_attention_interval is 0"),
    ("minimax-01", {"minimax-01.attention.recurrent_layers": [True] * 4}, None,
     "recurrent_layers has 4 flags for block_count 8"),
    ("minimax-01", {"minimax-01.attention.recurrent_layers": [True] * 8}, None, "missing tensor blk.7.attn_qkv.weight"),
    ("minimax-01", {key(Keys.LLM.BLOCK_COUNT, "minimax-01"): 1},
     lambda n, q, d: None if n.startswith("blk.") and not n.startswith("blk.0.") else (d, q),
     "a lone layer of lightning attention"),
    ("minimax-01", None, dropped("blk.3.attn_norm_2.weight"), "missing tensor blk.3.attn_norm_2.weight"),
    ("minimax-01", None, dropped("blk.2.ffn_gate_inp.weight"), "missing tensor blk.2.ffn_gate_inp.weight"),
    # llama.cpp stops on a Kimi-K3 file without the residuals' block size, the SiTU betas, the gating
    # function, its own LM head or a layer's selection bias; its graph takes K_b and V_b apart only
    # (an attn_kv_b reaches an attention input it never built) and Q, K and V apart on KDA layers
    # (its biases there: test_kimi_k3.py); a lower bound that is not negative is no safe gate
    ("kimi-k3", {"kimi-k3.attn_res.block_size": None}, None, "missing metadata key kimi-k3.attn_res.block_size"),
    ("kimi-k3", {"kimi-k3.activation.situ_linear_beta": None}, None,
     "missing metadata key kimi-k3.activation.situ_linear_beta"),
    ("kimi-k3", {key(Keys.LLM.EXPERT_GATING_FUNC, "kimi-k3"): None}, None,
     "missing metadata key kimi-k3.expert_gating_func"),
    ("kimi-k3", None, dropped("output.weight"), "missing tensor output.weight"),
    ("kimi-k3", None, dropped("blk.2.exp_probs_b.bias"), "missing tensor blk.2.exp_probs_b.bias"),
    ("kimi-k3", None, dropped("blk.2.ffn_res_score.weight"), "missing tensor blk.2.ffn_res_score.weight"),
    ("kimi-k3", None, older_kv_b, "tensor blk.1.attn_kv_b.weight: llama.cpp's kimi-k3 graph takes attn_k_b"),
    ("kimi-k3", None, fused_qkv("blk.0."), "missing tensor blk.0.attn_q.weight"),
    ("kimi-k3", {"kimi-k3.kda.gate_lower_bound": 0.0}, None, "kimi-k3.kda.gate_lower_bound is 0"),
    # llama.cpp stops on an exaone-moe file without a gating function, a window, its own LM head, a QK-norm or
    # the shared MLP, or with a tensor its loader has none of; its graph asserts the whole head rotated
    ("exaone-moe", {key(Keys.LLM.EXPERT_GATING_FUNC, "exaone-moe"): None}, None,
     "missing metadata key exaone-moe.expert_gating_func"),
    ("exaone-moe", {key(Keys.Attention.SLIDING_WINDOW, "exaone-moe"): None}, None,
     "missing metadata key exaone-moe.attention.sliding_window"),
    ("exaone-moe", None, lambda n, q, d: None if n == "output.weight" else (d, q), "missing tensor output.weight"),
    ("exaone-moe", None, dropped("blk.1.attn_q_norm.weight"), "missing tensor blk.1.attn_q_norm.weight"),
    ("exaone-moe", None, dropped("blk.2.ffn_gate_shexp.weight"), "missing tensor blk.2.ffn_gate_shexp.weight"),
    ("exaone-moe", None, lambda n, q, d: (d, q, "blk.1.ffn_gate_inp_shexp.weight") if n == "blk.1.exp_probs_b.bias"
     else (d, q), "tensor blk.1.ffn_gate_inp_shexp.weight is not part of llama.cpp's exaone-moe graph"),
    ("exaone-moe", {key(Keys.Rope.DIMENSION_COUNT, "exaone-moe"): 8}, None, "rope dimension count 8"),
    # llama.cpp stops on a muse-glimmer file without a logit scale, a window, its own LM head, a QK-norm or a
    # gate, with values narrower than keys or a tensor its loader has none of; its sliding layers rotate
    # unscaled, without rope_freqs: RoPE scaling is refused
    ("muse-glimmer", {key(Keys.LLM.LOGIT_SCALE, "muse-glimmer"): None}, None,
     "missing metadata key muse-glimmer.logit_scale"),
    ("muse-glimmer", {key(Keys.Attention.SLIDING_WINDOW, "muse-glimmer"): None}, None,
     "missing metadata key muse-glimmer.attention.sliding_window"),
    ("muse-glimmer", None, lambda n, q, d: None if n == "output.weight" else (d, q), "missing tensor output.weight"),
    ("muse-glimmer", None, dropped("blk.2.attn_k_norm.weight"), "missing tensor blk.2.attn_k_norm.weight"),
    ("muse-glimmer", None, dropped("blk.1.attn_gate.weight"), "missing tensor blk.1.attn_gate.weight"),
    ("muse-glimmer", {key(Keys.Attention.VALUE_LENGTH, "muse-glimmer"): 8}, None,
     "value_length 8 is not key_length 16"),
    ("muse-glimmer", None, lambda n, q, d: (d, q, "blk.0.attn_output.bias") if n == "blk.0.attn_norm.weight"
     else (d, q), "tensor blk.0.attn_output.bias is not part of llama.cpp's muse-glimmer graph"),
    ("muse-glimmer", {key(Keys.Rope.SCALING_TYPE, "muse-glimmer"): "linear",
                      key(Keys.Rope.SCALING_FACTOR, "muse-glimmer"): 2.0}, None, "RoPE scaling (or rope_freqs)"),
    # llama.cpp stops on a GLM-5.3-Flash file without the pool size, with pools that do not divide the
    # indexer's top-k, hyper-connections of other than 4 streams, RoPE on its latent attention, a shared
    # indexer layer before any full one, an attn_kv_b, a fused attn_qkv (its KDA graph reads attn_q), or
    # without its own LM head, the indexer's tensors on a full layer or the experts' selection bias; a
    # lower bound that is not negative is no safe gate
    ("glm5next", {"glm5-next.attention.indexer.kpool": None}, None,
     "missing metadata key glm5-next.attention.indexer.kpool"),
    ("glm5next", {"glm5-next.attention.indexer.kpool": 3}, None, "indexer.top_k 16 in pools of 3"),
    ("glm5next", {"glm5-next.hyper_connection.count": 2}, None, "2 hyper-connection streams"),
    ("glm5next", {key(Keys.Rope.DIMENSION_COUNT, "glm5-next"): 8}, None, "rope.dimension_count is 8"),
    ("glm5next", {"glm5-next.attention.indexer.types": [True, False, True, True]}, None,
     "layer 1 shares the selection of an earlier layer, and there is none"),
    ("glm5next", None, older_kv_b, "tensor blk.1.attn_kv_b.weight: llama.cpp's glm5-next loader takes attn_k_b"),
    ("glm5next", None, fused_qkv("blk.0."), "missing tensor blk.0.attn_q.weight"),
    ("glm5next", None, dropped("output.weight"), "missing tensor output.weight"),
    ("glm5next", None, dropped("blk.1.indexer_compressor_ape.weight"),
     "missing tensor blk.1.indexer_compressor_ape.weight"),
    ("glm5next", None, dropped("blk.2.exp_probs_b.bias"), "missing tensor blk.2.exp_probs_b.bias"),
    ("glm5next", {"glm5-next.kda.gate_lower_bound": 0.0}, None, "glm5-next.kda.gate_lower_bound is 0"),
])
def test_what_llama_cpp_does_not_compute_is_refused(name, metadata, transform, message, tiny_model, tmp_path):
    _, path = tiny_model(name)
    bad = rewrite_gguf(path, tmp_path / "bad.gguf", transform, metadata=metadata)
    with pytest.raises(UserError, match=re.escape(message)):   # when the file is opened or a layer loaded
        arch = load_architecture(GGUFIndex(bad))
        for i in range(arch.hp.n_layers):
            arch.load_layer(i, "cpu", torch.float32)


@pytest.mark.parametrize("extra", [
    {"blk.7.attn_output.bias": (np.zeros(64, np.float32), Q.F32)},
    {"blk.0.attn_q_norm.weight": (np.ones(16, np.float32), Q.F32)},
    {"blk.1.exp_probs_b.bias": (np.zeros(4, np.float32), Q.F32)},
    {"rope_freqs.weight": (np.ones(8, np.float32), Q.F32)},
])
def test_minimax01_refuses_a_tensor_llama_cpp_does_not_create(extra, tiny_model, tmp_path):
    # llama.cpp's loader counts the tensors it creates against the file's, and stops on any other
    _, path = tiny_model("minimax-01")
    bad = rewrite_gguf(path, tmp_path / "bad.gguf", extra=extra)
    with pytest.raises(UserError, match=re.escape(f"tensor {next(iter(extra))} is not one llama.cpp's minimax-01")):
        load_architecture(GGUFIndex(bad))


def test_minimax01_takes_one_head_count_for_every_layer(tiny_model, tmp_path):
    # llama.cpp's graph takes layer 0's head count on every layer: a file with several is refused
    _, path = tiny_model("minimax-01")
    heads = key(Keys.Attention.HEAD_COUNT, "minimax-01")
    scalar_removed = rewrite_gguf(path, tmp_path / "no-heads.gguf", metadata={heads: None})
    bad = rewrite_gguf(scalar_removed, tmp_path / "bad.gguf", metadata={heads: [4] * 7 + [2]})
    with pytest.raises(UserError, match=re.escape(f"{heads} differs between layers")):
        load_architecture(GGUFIndex(bad))


def meets_transformers(model, path, ids, atol: float, bfloat16_nats: float) -> None:
    """The GGUF's float32 logits within `atol` of the Hugging Face model's, and its bfloat16 NLL
    within `bfloat16_nats` of its float32 one."""
    ours = forward(path, ids)
    with torch.inference_mode():
        ref = model(ids).logits
    assert (ours - ref).abs().max().item() < atol
    rounded = forward(path, ids, torch.bfloat16)
    nlls = [F.cross_entropy(x[:, :-1].flatten(0, 1), ids[:, 1:].flatten()).item() for x in (ours, rounded)]
    assert abs(nlls[1] - nlls[0]) <= bfloat16_nats


def test_exaone4_slides_and_drops_rope_at_the_32b_size_only(tiny_model):
    """llama.cpp gives EXAONE 4.0's 64-layer size (the 32B) a sliding window on three layers of
    four and no RoPE on the fourth; transformers computes the same for this config, so the
    64-layer fixture's logits meet transformers' as every family's do."""
    model, path = tiny_model("exaone4_32b")
    arch = load_architecture(GGUFIndex(path))
    assert [s.attention.span for s in arch.specs[:4]] == [32, 32, 32, None]
    assert [s.attention.rope is None for s in arch.specs[:8]] == [False, False, False, True] * 2
    small = load_architecture(GGUFIndex(tiny_model("exaone4")[1]))
    assert all(s.attention.span is None and s.attention.rope is not None for s in small.specs)
    meets_transformers(model, path, random_ids(), 2e-4, 0.011)      # measured 2.0e-5 and 0.0051


def test_command_r_plus_norms_each_head_by_its_own_layer_norm(tiny_model):
    """Command R+'s QK-norm (which llama.cpp reads at 64 layers): a LayerNorm per head with weights
    of its own, [heads, head size]."""
    model, path = tiny_model("command-r-plus")
    layer = load_architecture(GGUFIndex(path)).layer_shapes(0, torch.float32)
    assert tuple(layer.attention.q_norm.shape) == (4, 16) and tuple(layer.attention.k_norm.shape) == (2, 16)
    meets_transformers(model, path, random_ids(), 2e-4, 0.016)      # measured 7.9e-5 and 0.0077


def test_gemma4_boundaries_carry_the_shared_kv_of_the_layers_that_reuse_it(tiny_model):
    """The fixture's last two layers (4 sliding, 5 global) attend over the K/V of layers 2 and 3:
    a boundary between a source and its last reader carries the source's K and V beside the
    hidden state (KV heads x head size each), the last boundary the hidden state only. (Its
    experts, routed on the stream, run in slices as any family's: the conformance matrix.)"""
    arch = load_architecture(GGUFIndex(tiny_model("gemma4")[1]))
    assert arch.kv_sources == [0, 1, 2, 3, 2, 3]
    sliding, full = 2 * 2 * 16, 2 * 2 * 32                      # K and V of 2 KV heads of 16 / of 32
    # past layer 4, the last reader of layer 2's K/V, only layer 3's are carried
    assert [arch.boundary_width(cut) for cut in range(7)] == [64, 64, 64, 64 + sliding, 64 + sliding + full,
                                                              64 + full, 64]


@pytest.mark.parametrize("scores,k,kept", [   # libstdc++ 12's std::partial_sort, as ggml_top_k calls it
    ([0, 2, 0, 1, 1, 1, 2, 1, 2, 0, 2, 2, 2, 1, 1, 2, 1], 5, [1, 6, 8, 10, 11]),
    ([1, 1, 1, 2, 2, 1, 2, 1, 1, 2, 1, 1], 6, [0, 1, 3, 4, 6, 9]),
    ([0, 0, 0, 1, 1, 1, 1, 1, 1, 0, 1, 0, 0, 0, 2, 1, 1], 3, [4, 5, 14]),
    ([2, 0, 2, 1, 2, 0, 0, 1, 2, 2, 1, 1, 0, 0, 2, 1, 1], 3, [0, 2, 4]),
    ([0, 2, 1, 2, 0, 1, 2, 2, 2, 1, 0, 2, 1, 1, 1, 1], 6, [1, 3, 6, 7, 8, 11]),
])
def test_tied_top_k_keeps_the_keys_ggml_keeps(scores, k, kept):
    """Where the k-th score is tied, DeepSeek Sparse Attention keeps the keys llama.cpp's heap
    selection keeps (not the lowest indices: the third case keeps 4 and 5 of the ones, not 3)."""
    assert sorted(heap_select.heap_select([float(s) for s in scores], k)) == kept


def test_glm_dsa_carries_the_shared_selection_exactly_in_16_bit_boundaries(tiny_model):
    """GLM-5.2's shared layers (1, 3 and 4 of the fixture) attend to the keys the full layer
    before them selected: a boundary before a shared layer carries that selection beside the
    hidden state, as positions that a bfloat16 boundary holds exactly."""
    arch = load_architecture(GGUFIndex(tiny_model("glm-dsa")[1]))
    assert [arch.boundary_width(cut) for cut in range(6)] == [64, 64 + 32, 64, 64 + 32, 64 + 32, 64]
    T, top_k = 300, 16
    scores = torch.rand(2, T, T, generator=torch.Generator().manual_seed(0))
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    best = scores.masked_fill(~causal, -1).topk(top_k, dim=-1).indices
    selected = torch.zeros(2, T, T, dtype=torch.bool).scatter_(-1, best, True) & causal
    x = torch.cat([torch.randn(2, T, 64), glm_dsa.pack_selection(selected, top_k, torch.float32)], dim=-1)
    _, carried = glm_dsa.unpack_selection(x.to(torch.bfloat16).to(torch.float32), top_k)
    assert torch.equal(carried, selected)


def test_yarn_mscale_is_mscale_all_dim_for_deepseek2_files_only(tiny_model, tmp_path):
    """A file holds only mscale_all_dim (0.1 x it, as rope.scaling.yarn_log_multiplier); llama.cpp
    takes DeepSeek's mscale to be equal to it for deepseek2 files and to be 1 for mistral4 and
    deepseek32 ones (llama-perplexity on the mistral4 fixture with 0.08 there: 2642.5152, ours
    2642.5165; with mscale read as 0.8, 2746.33)."""
    ds2 = load_architecture(GGUFIndex(tiny_model("deepseek2")[1]))
    assert ds2.yarn_mscales() == pytest.approx((0.8, 0.8))
    m4 = rewrite_gguf(tiny_model("mistral4")[1], tmp_path / "m4.gguf",
                      metadata={key(Keys.Rope.SCALING_YARN_LOG_MUL, "mistral4"): 0.08})
    assert load_architecture(GGUFIndex(m4)).yarn_mscales() == pytest.approx((1.0, 0.8))


def test_step35_rope_factors_reach_its_global_layers_only(tiny_model, tmp_path):
    # llama.cpp's graph passes rope_freqs to the global layers, over the half of each head they
    # rotate (llama-perplexity on this file: 2732.0642, ours 2732.0639; without it 2652.8107 / 2652.8103)
    _, path = tiny_model("step35")
    factors = np.array([1.0, 3.0, 40.0, 9.0, 1.0, 1.0, 1.0, 1.0], dtype=np.float32)   # head size / 2, padded with 1
    scaled = rewrite_gguf(path, tmp_path / "factors.gguf", extra={"rope_freqs.weight": (factors, Q.F32)})
    arch = load_architecture(GGUFIndex(scaled))
    ropes = [spec.attention.rope for spec in arch.specs]
    assert [(r.dim, r.freq_factors) for r in ropes] == [(8, (1.0, 3.0, 40.0, 9.0)), (16, None), (16, None),
                                                        (8, (1.0, 3.0, 40.0, 9.0))]
    ids = random_ids()
    assert abs(nll(scaled, ids) - nll(path, ids)) > MOVED


def test_laguna_global_layers_rotate_layer_0s_width(tiny_model, tmp_path):
    # llama.cpp's graph rotates every global layer by layer 0's width: where layer 0 slides, the
    # sliding width, under the global YaRN (llama-perplexity on this file: 4019.8768, ours 4019.8781;
    # with the global layer's own 8, our NLL moves by 0.03)
    _, path = tiny_model("laguna")
    last_global = rewrite_gguf(path, tmp_path / "last-global.gguf",
                               metadata={key(Keys.Attention.SLIDING_WINDOW_PATTERN, "laguna"): [True] * 3 + [False]})
    ropes = [spec.attention.rope for spec in load_architecture(GGUFIndex(last_global)).specs]
    assert [(r.dim, r.yarn is not None) for r in ropes] == [(16, False)] * 3 + [(16, True)]


def test_kimi_linear_reads_a_fused_qkv_as_its_three_projections(tiny_model, tmp_path):
    # llama.cpp loads a KDA layer's attn_qkv where the file has one (split into Q, K, V of
    # heads x kda.head_dim rows each, then each through its own convolution)
    _, path = tiny_model("kimi-linear")
    tensors = {t.name: np.asarray(t.data) for t in GGUFReader(str(path)).tensors}

    def fused(name, qtype, data):
        block, _, kind = name.rpartition(".weight")[0].rpartition(".")
        if f"{block}.ssm_conv1d_q.weight" not in tensors:   # not a KDA layer's
            return data, qtype
        if kind in ("attn_k", "attn_v"):
            return None
        if kind == "attn_q":
            parts = [tensors[f"{block}.attn_{x}.weight"] for x in "qkv"]
            return np.concatenate(parts, axis=0), qtype, f"{block}.attn_qkv.weight"
        return data, qtype
    joined = rewrite_gguf(path, tmp_path / "fused.gguf", fused)
    names = GGUFIndex(joined).tensors
    assert "blk.0.attn_qkv.weight" in names and "blk.0.attn_q.weight" not in names and "blk.2.attn_q.weight" in names
    ids = random_ids()
    torch.testing.assert_close(forward(joined, ids), forward(path, ids), rtol=0, atol=1e-5)


def test_qwen4exp_ngram_rows_are_transformers_at_every_eos_and_sequence_start(tiny_model):
    """The n-gram hash embedding's rows of token ids with EOS (id 0) here and there, from the
    GGUF's metadata and table, equal those transformers' embedding gathers (its own hash: int64
    products, a segment reset at each EOS)."""
    model, path = tiny_model("qwen4exp")
    arch = load_architecture(GGUFIndex(path))
    ids = random_ids(3, 40, seed=5)
    ids[0, [0, 1, 7]] = 0
    ids[1, [5, 6, 20, 39]] = 0
    ids[2, 2] = 0
    rows = qwen4exp.NGramRows(arch, "cpu", torch.float32)(ids)[arch.ple_layer]         # [B, T, heads x width]
    with torch.inference_mode():
        ref = model.model.layers[arch.ple_layer].ple.ple_embedding(ids, None)
    assert rows.shape == ref.shape
    assert torch.equal(rows, ref)


def test_qwen4exp_ngram_tables_past_the_embedding_are_refused_before_any_work(tiny_model, tmp_path):
    _, path = tiny_model("qwen4exp")
    changed = rewrite_gguf(path, tmp_path / "changed.gguf", metadata={"qwen4exp.ple.head_offsets": [0, 101, 204, 400]})
    with pytest.raises(UserError, match="do not fit n-grams of 3"):
        load_architecture(GGUFIndex(changed))


def test_qwen4exp_indexer_tensors_under_compress_ratios_of_0_leave_attention_dense(tiny_model, tmp_path):
    """A converter writes the indexer on every attention layer; with compress ratios of 0 llama.cpp
    computes dense attention and leaves it unused: the file gives the NLL of the same file without
    those tensors, not the sparse file's."""
    _, path = tiny_model("qwen4exp")
    dense = {"qwen4exp.attention.compress_ratios": [0, 0, 0, 0]}
    kept = rewrite_gguf(path, tmp_path / "kept.gguf", metadata=dense)
    without = rewrite_gguf(path, tmp_path / "without.gguf", lambda n, q, d: None if ".indexer." in n else (d, q),
                           metadata=dense)
    assert any(".indexer." in name for name in GGUFIndex(kept).tensors)
    ids = random_ids()
    assert nll(kept, ids) == nll(without, ids)
    assert abs(nll(kept, ids) - nll(path, ids)) > MOVED


@pytest.mark.parametrize("name,extra", [("mamba", "blk.1.ssm_dt_norm.weight"), ("jamba", "blk.2.attn_output.bias")])
def test_tensors_llama_cpp_does_not_load_are_refused(name, extra, tiny_model, tmp_path):
    """llama.cpp's mamba loader creates no norm weights for dt, B and C (Falcon-Mamba norms without
    them), its jamba loader no attention output bias: a file with one fails its tensor count, and is
    refused here by name rather than computed."""
    _, path = tiny_model(name)
    bad = rewrite_gguf(path, tmp_path / "bad.gguf", extra={extra: (np.ones(4 if "ssm" in extra else 64, np.float32),
                                                                  Q.F32)})
    with pytest.raises(UserError, match=re.escape(f"tensor {extra} is not part of")):
        arch = load_architecture(GGUFIndex(bad))
        for i in range(arch.hp.n_layers):
            arch.load_layer(i, "cpu", torch.float32)
