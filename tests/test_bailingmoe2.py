"""Ling 2.0 (bailingmoe2) on a tiny random checkpoint written as its modeling code names the
weights (tests/hf_models.py: transformers has no class of it) and converted by llama.cpp's
converter: the PPL through the Luigi tasks in 2-layer windows against llama-perplexity's on the
same file, and the logits against a forward written from the Hugging Face modeling code over the
checkpoint itself (its forms moving the NLL and its refusals: test_open_families.py; its passes:
the conformance matrix)."""
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as Q
from safetensors.torch import load_file

from pipeline.errors import UserError
from pipeline.gguf_io.reader import GGUFIndex
from pipeline.model.arch import load_architecture

from .helpers import assert_logits_are_the_reference_s, ppl_in_two_layer_windows
from .tiny_gguf import rewrite_gguf

# llama-perplexity (llama-cpp-python 0.3.36) -f wikitext-2-test.head40k.txt -c 256 --chunks 8 -t 2
# -fa off -ctk f32 -ctv f32 (with llama.cpp's defaults, flash attention on f16 keys and values: 2586.4497)
LLAMA_PPL = 2581.3776


def test_perplexity_in_two_layer_windows_is_llama_perplexity_s(tiny_model, tmp_path):
    """Measured: 2581.3777, 4e-8 nats away; the multi-token-prediction layer after the trunk
    unread by both (llama.cpp warns of its tensors as unused)."""
    _, path = tiny_model("bailingmoe2")
    result = ppl_in_two_layer_windows(path, tmp_path)
    assert result["model"]["n_layers"] == 4 and len(result["placement"]) == 2
    assert abs(math.log(result["ppl"]) - math.log(LLAMA_PPL)) < 1e-5


def reference_logits(folder, ids: torch.Tensor) -> torch.Tensor:
    """ids [B, T] -> logits [B, T, vocab] as BailingMoeV2ForCausalLM computes them from its
    checkpoint: QK-norm then RoPE on the first partial_rotary_factor of each head (rotate_half),
    sigmoid scores, the selection bias for choosing groups (their two best) and experts only."""
    c, w = json.loads((folder / "config.json").read_text()), load_file(folder / "model.safetensors")
    H, NH, NKV, D = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    rot, (B, T) = int(D * c["partial_rotary_factor"]), ids.shape
    rms = lambda x, weight: weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c["rms_norm_eps"])  # noqa: E731

    def mlp(x, p):
        return F.linear(F.silu(F.linear(x, w[p + "gate_proj.weight"])) * F.linear(x, w[p + "up_proj.weight"]),
                        w[p + "down_proj.weight"])

    angles = torch.outer(torch.arange(T).float(), c["rope_theta"] ** (-torch.arange(0, rot, 2).float() / rot))
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()   # [T, rot]

    def rope(x):                                    # [B, heads, T, D]: rotate_half on the first `rot`
        r, rest = x[..., :rot], x[..., rot:]
        half = torch.cat([-r[..., rot // 2:], r[..., :rot // 2]], -1)
        return torch.cat([r * cos + half * sin, rest], -1)

    x = w["model.word_embeddings.weight"][ids]                                  # [B, T, H]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        qkv = F.linear(rms(x, w[p + "input_layernorm.weight"]), w[p + "attention.query_key_value.weight"])
        q, k, v = qkv.view(B, T, NH + 2 * NKV, D).split([NH, NKV, NKV], dim=2)
        q = rope(rms(q, w[p + "attention.query_layernorm.weight"]).transpose(1, 2))
        k = rope(rms(k, w[p + "attention.key_layernorm.weight"]).transpose(1, 2)).repeat_interleave(NH // NKV, 1)
        v = v.transpose(1, 2).repeat_interleave(NH // NKV, 1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1 / math.sqrt(D))
        x = x + F.linear(a.transpose(1, 2).reshape(B, T, NH * D), w[p + "attention.dense.weight"])
        h = rms(x, w[p + "post_attention_layernorm.weight"]).reshape(B * T, H)
        if i < c["first_k_dense_replace"]:
            x = x + mlp(h, p + "mlp.").view(B, T, H)
            continue
        scores = torch.sigmoid(F.linear(h, w[p + "mlp.gate.weight"]))           # [B T, E]
        choice = scores + w[p + "mlp.gate.expert_bias"]
        E, G = choice.shape[1], c["n_group"]
        groups = choice.view(-1, G, E // G).topk(2, -1).values.sum(-1).topk(c["topk_group"], -1).indices
        kept = torch.zeros(B * T, G, dtype=torch.bool).scatter_(1, groups, True).repeat_interleave(E // G, 1)
        top = choice.masked_fill(~kept, -math.inf).topk(c["num_experts_per_tok"], -1).indices
        weights = scores.gather(1, top)
        weights = weights / weights.sum(-1, keepdim=True) * c["routed_scaling_factor"]
        out = mlp(h, p + "mlp.shared_experts.")
        for e in range(E):
            rows, slot = (top == e).nonzero(as_tuple=True)
            out[rows] += weights[rows, slot, None] * mlp(h[rows], p + f"mlp.experts.{e}.")
        x = x + out.view(B, T, H)
    return F.linear(rms(x, w["model.norm.weight"]), w["lm_head.weight"])


def test_logits_are_the_modeling_code_s_over_the_checkpoint(tiny_model):
    """Measured max |difference| 1.2e-5 on logits of std 1.9."""
    _, path = tiny_model("bailingmoe2")
    assert_logits_are_the_reference_s(path, reference_logits, path.parent / "bailingmoe2-hf")



def test_attention_biases_are_refused_as_llama_cpp_refuses_them(tiny_model, tmp_path):
    """llama.cpp's loader creates no bias for this family's attention: a file with one fails its
    tensor count, and is refused here by name rather than computed."""
    _, path = tiny_model("bailingmoe2")
    bad = rewrite_gguf(path, tmp_path / "bias.gguf", extra={"blk.1.attn_qkv.bias": (np.zeros(128, np.float32), Q.F32)})
    with pytest.raises(UserError, match="tensor blk.1.attn_qkv.bias is not part of llama.cpp's bailingmoe2 graph"):
        load_architecture(GGUFIndex(bad)).load_layer(1, "cpu", torch.float32)
