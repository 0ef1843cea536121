"""Nemotron-51B, Super and Ultra (deci) on a tiny random checkpoint written as DeciLM's modeling code
names the weights (tests/hf_models.py: transformers has no class of it) and converted by llama.cpp's
converter: the PPL through the Luigi tasks in 2-layer windows against llama-perplexity's on the
same file, and the logits against a forward written from DeciLM's modeling code over the checkpoint
itself (its forms moving the NLL and its refusals: test_open_families.py; its passes: the
conformance matrix)."""
import json
import math

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from .helpers import assert_logits_are_the_reference_s, ppl_in_two_layer_windows

# llama-perplexity (llama-cpp-python 0.3.36) -f wikitext-2-test.head40k.txt -c 256 --chunks 8 -t 2
# -fa off -ctk f32 -ctv f32
LLAMA_PPL = 2366.4174


def test_perplexity_in_two_layer_windows_is_llama_perplexity_s(tiny_model, tmp_path):
    """Measured: 2366.4181, 3e-7 nats away, in windows [0, 2), [2, 4) (Ultra's empty layer first) and [4, 5)."""
    _, path = tiny_model("deci")
    result = ppl_in_two_layer_windows(path, tmp_path)
    assert result["model"]["n_layers"] == 5 and len(result["placement"]) == 3
    assert abs(math.log(result["ppl"]) - math.log(LLAMA_PPL)) < 1e-5


def llama3_frequencies(c: dict, dim: int) -> torch.Tensor:
    """[dim / 2] inverse frequencies of Llama 3's RoPE: long wavelengths divided by `factor`, short ones
    kept, those between blended."""
    r = c["rope_parameters"]
    inv = r["rope_theta"] ** (-torch.arange(0, dim, 2).float() / dim)
    wavelength = 2 * math.pi / inv
    low, high = r["original_max_position_embeddings"] / r["low_freq_factor"], \
        r["original_max_position_embeddings"] / r["high_freq_factor"]
    scaled = torch.where(wavelength > low, inv / r["factor"], inv)
    smooth = (r["original_max_position_embeddings"] / wavelength - r["low_freq_factor"]) / \
        (r["high_freq_factor"] - r["low_freq_factor"])
    blended = (1 - smooth) * scaled / r["factor"] + smooth * scaled
    return torch.where((wavelength >= high) & (wavelength <= low), blended, scaled)


def reference_logits(folder, ids: torch.Tensor) -> torch.Tensor:
    """ids [B, T] -> logits [B, T, vocab] as DeciLMForCausalLM computes them from its checkpoint: each
    layer as its block_configs entry says, attention (rotate_half RoPE, n_heads_in_group query heads per
    KV head), its linear replacement or nothing, then the SwiGLU or nothing, each behind its norm."""
    c, w = json.loads((folder / "config.json").read_text()), load_file(folder / "model.safetensors")
    NH, D, (B, T) = c["num_attention_heads"], c["head_dim"], ids.shape
    rms = lambda x, weight: weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c["rms_norm_eps"])  # noqa: E731
    angles = torch.outer(torch.arange(T).float(), llama3_frequencies(c, D))
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()   # [T, D]

    def rope(x):                                    # [B, heads, T, D]
        return x * cos + torch.cat([-x[..., D // 2:], x[..., :D // 2]], -1) * sin

    def heads(x, n):                                # [B, T, n D] -> [B, n, T, D]
        return x.view(B, T, n, D).transpose(1, 2)

    x = w["model.embed_tokens.weight"][ids]                                  # [B, T, H]
    for i, block in enumerate(c["block_configs"]):
        p, attention = f"model.layers.{i}.", block["attention"]
        if attention["replace_with_linear"]:
            x = x + F.linear(rms(x, w[p + "input_layernorm.weight"]), w[p + "self_attn.linear_attn.weight"])
        elif not attention["no_op"]:
            h, group = rms(x, w[p + "input_layernorm.weight"]), attention["n_heads_in_group"]
            q = rope(heads(F.linear(h, w[p + "self_attn.q_proj.weight"]), NH))
            k = rope(heads(F.linear(h, w[p + "self_attn.k_proj.weight"]), NH // group)).repeat_interleave(group, 1)
            v = heads(F.linear(h, w[p + "self_attn.v_proj.weight"]), NH // group).repeat_interleave(group, 1)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1 / math.sqrt(D))
            x = x + F.linear(a.transpose(1, 2).reshape(B, T, NH * D), w[p + "self_attn.o_proj.weight"])
        if not block["ffn"]["no_op"]:
            h = rms(x, w[p + "post_attention_layernorm.weight"])
            gated = F.silu(F.linear(h, w[p + "mlp.gate_proj.weight"])) * F.linear(h, w[p + "mlp.up_proj.weight"])
            x = x + F.linear(gated, w[p + "mlp.down_proj.weight"])
    return F.linear(rms(x, w["model.norm.weight"]), w["lm_head.weight"])


def test_logits_are_the_modeling_code_s_over_the_checkpoint(tiny_model):
    """Measured max |difference| 9.4e-5 on logits of std 2.0 (8.9e-5 from the modeling code's forward in
    float64, which its own float32 forward misses by 2.8e-5)."""
    _, path = tiny_model("deci")
    assert_logits_are_the_reference_s(path, reference_logits, path.parent / "deci-hf")
