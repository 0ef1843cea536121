"""Kimi-K3 (kimi-k3) on a tiny random checkpoint written as its modeling code names the weights
(tests/hf_models.py: transformers has no class of it) and converted by llama.cpp's converter: the
PPL through the luigi command in 2-layer windows against llama-perplexity's on the same file, and
the logits against a forward written from the published modeling code (KimiK3DecoderLayer,
KimiK3AttentionResidual, KimiK3DeltaAttention's step-by-step rule, KimiK3GatedMLA, KimiK3MoE) over
the checkpoint itself (its forms moving the NLL and its refusals: test_open_families.py; its passes:
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
from pipeline.model.executor import WindowExecutor

from .helpers import forward, ppl_in_two_layer_windows, random_ids
from .tiny_gguf import rewrite_gguf

# llama-perplexity (llama-cpp-python 0.3.36) -f wikitext-2-test.head40k.txt -c 256 --chunks 8 -t 2
# -fa off -ctk f32 -ctv f32 (with llama.cpp's defaults, flash attention on f16 keys and values: 2550.8636)
LLAMA_PPL = 2551.9734


def test_perplexity_in_two_layer_windows_is_llama_perplexity_s(tiny_model, tmp_path):
    """Measured: 2551.9747, 5e-7 nats away; the boundary after layer 2 carries the banked embedding
    beside the stream."""
    _, path = tiny_model("kimi-k3")
    result = ppl_in_two_layer_windows(path, tmp_path)
    assert result["model"]["n_layers"] == 4 and len(result["placement"]) == 2
    assert abs(math.log(result["ppl"]) - math.log(LLAMA_PPL)) < 1e-5


def reference_logits(folder, ids: torch.Tensor) -> torch.Tensor:
    """ids [B, T] -> float64 logits [B, T, vocab] as the Kimi-K3 modeling code computes them from its
    checkpoint: each layer's input and its FFN's input an attention over the banked residuals and the
    stream (a layer starting a block banks its input, and its stream restarts from the attention's
    output), the last stream mixed once more before the final norm."""
    c = json.loads((folder / "config.json").read_text())["text_config"]
    w = {k.removeprefix("language_model."): v.double() for k, v in load_file(folder / "model.safetensors").items()}
    kda, eps, (B, T) = c["linear_attn_config"], c["rms_norm_eps"], ids.shape
    NH, dk, beta, linear_beta = c["num_attention_heads"], kda["head_dim"], c["activation_situ_beta"], \
        c["activation_situ_linear_beta"]
    rms = lambda x, weight: weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)  # noqa: E731
    linear = lambda x, name: F.linear(x, w[name + ".weight"])  # noqa: E731

    def situ(gate, up):
        up = linear_beta * torch.tanh(up / linear_beta)
        return beta * torch.tanh(gate / beta) * torch.sigmoid(gate) * up

    def mlp(x, p, gate="gate_proj", up="up_proj", down="down_proj"):
        return linear(situ(linear(x, f"{p}.{gate}"), linear(x, f"{p}.{up}")), f"{p}.{down}")

    def attention_residual(h, banked, p):
        """Pseudo-query attention over the banked residuals and the stream h [B, T, H]."""
        values = torch.stack([*banked, h], dim=2)                                     # [B, T, n, H]
        scores = rms(values, w[p + "_res_norm.weight"]) @ w[p + "_res_proj.weight"].T    # [B, T, n, 1]
        return (scores.softmax(2) * values).sum(2)

    def conv(x, weight):                                                  # causal depthwise, then SiLU
        width = weight.shape[-1]
        return F.silu(F.conv1d(F.pad(x.transpose(1, 2), (width - 1, 0)), weight, groups=x.shape[-1]).transpose(1, 2))

    def delta_attention(x, p):
        q, k, v = (conv(linear(x, f"{p}.{n}_proj"), w[f"{p}.{n}_conv1d.weight"]).view(B, T, NH, dk) for n in "qkv")
        q = q * torch.rsqrt(q.pow(2).sum(-1, keepdim=True) + 1e-6) / math.sqrt(dk)
        k = k * torch.rsqrt(k.pow(2).sum(-1, keepdim=True) + 1e-6)
        forget = linear(linear(x, f"{p}.f_a_proj"), f"{p}.f_b_proj").view(B, T, NH, dk) + w[f"{p}.dt_bias"].view(NH, dk)
        g = kda["gate_lower_bound"] * torch.sigmoid(w[f"{p}.A_log"].exp().view(NH, 1) * forget)
        b = torch.sigmoid(linear(x, f"{p}.b_proj"))                                    # [B, T, NH]
        state, out = torch.zeros(B, NH, dk, dk, dtype=x.dtype), torch.zeros(B, T, NH, dk, dtype=x.dtype)
        for t in range(T):                                              # the delta rule, token by token
            state = state * g[:, t].exp()[..., None]
            delta = (v[:, t] - (state * k[:, t, ..., None]).sum(-2)) * b[:, t, :, None]
            state = state + k[:, t, ..., None] * delta[..., None, :]
            out[:, t] = (state * q[:, t, ..., None]).sum(-2)
        out = rms(out, w[f"{p}.o_norm.weight"]) * torch.sigmoid(linear(x, f"{p}.g_proj").view(B, T, NH, dk))
        return linear(out.reshape(B, T, NH * dk), f"{p}.o_proj")

    def gated_mla(x, p):
        nope, rope, v_dim, rank = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"]
        q = linear(rms(linear(x, f"{p}.q_a_proj"), w[f"{p}.q_a_layernorm.weight"]), f"{p}.q_b_proj")
        q = q.view(B, T, NH, nope + rope).transpose(1, 2)
        kv, k_shared = linear(x, f"{p}.kv_a_proj_with_mqa").split([rank, rope], dim=-1)
        kv = linear(rms(kv, w[f"{p}.kv_a_layernorm.weight"]), f"{p}.kv_b_proj").view(B, T, NH, nope + v_dim)
        k_nope, v = kv.transpose(1, 2).split([nope, v_dim], dim=-1)
        k = torch.cat([k_nope, k_shared[:, None].expand(B, NH, T, rope)], dim=-1)       # no RoPE anywhere
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=(nope + rope) ** -0.5)
        a = a.transpose(1, 2).reshape(B, T, NH * v_dim) * torch.sigmoid(linear(x, f"{p}.g_proj"))
        return linear(a, f"{p}.o_proj")

    def latent_moe(x, p):
        flat = x.reshape(B * T, -1)
        scores = torch.sigmoid(linear(flat, f"{p}.gate"))                               # [B T, E]
        top = (scores + w[f"{p}.gate.e_score_correction_bias"]).topk(c["num_experts_per_token"], -1).indices
        weights = scores.gather(1, top)
        weights = weights / weights.sum(-1, keepdim=True) * c["routed_scaling_factor"]
        latent = linear(flat, f"{p}.routed_expert_down_proj")                          # [B T, latent]
        routed = torch.zeros_like(latent)
        for e in range(c["num_experts"]):
            rows, slot = (top == e).nonzero(as_tuple=True)
            routed[rows] += weights[rows, slot, None] * mlp(latent[rows], f"{p}.experts.{e}", "w1", "w3", "w2")
        routed = linear(rms(routed, w[f"{p}.routed_expert_norm.weight"]), f"{p}.routed_expert_up_proj")
        return (routed + mlp(flat, f"{p}.shared_experts")).view(B, T, -1)

    h, banked = w["model.embed_tokens.weight"][ids], []                              # [B, T, H]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}"
        residual = h
        if banked:
            h = attention_residual(h, banked, f"{p}.self_attention")
        if i % c["attn_res_block_size"] == 0:       # a block starts: its input banked, the stream restarted
            banked.append(residual)
            residual = 0
        x = rms(h, w[f"{p}.input_layernorm.weight"])
        full = i + 1 in kda["full_attn_layers"]
        h = (gated_mla if full else delta_attention)(x, f"{p}.self_attn") + residual
        x = rms(attention_residual(h, banked, f"{p}.mlp"), w[f"{p}.post_attention_layernorm.weight"])
        dense = i < c["first_k_dense_replace"]
        h = h + (mlp(x, f"{p}.mlp") if dense else latent_moe(x, f"{p}.block_sparse_moe"))
    h = attention_residual(h, banked, "model.output_attn")
    return linear(rms(h, w["model.norm.weight"]), "lm_head")


def test_logits_are_the_modeling_code_s_over_the_checkpoint(tiny_model):
    """Both in float64 (our head's logits in float32): measured max |difference| 2.8e-5 on logits of
    std 2.0. In float32 the modeling code's own logits are 1.1e-3 from its float64 ones (the KDA
    outputs' RMSNorm magnifies rounding: 9e-6 relative after the first layer) and ours 6.4e-4."""
    _, path = tiny_model("kimi-k3")
    ids = random_ids()
    with torch.inference_mode():
        ref = reference_logits(path.parent / "kimi-k3-hf", ids).float()
    ours = forward(path, ids, torch.float64)
    assert ref.std() > 1.5
    assert (ours - ref).abs().max().item() < 2e-4
    assert (ours.argmax(-1) == ref.argmax(-1)).all()


def test_windows_of_one_and_two_layers_carry_the_banked_residuals(tiny_model):
    """Each boundary holds the residuals banked before it (the embedding from layer 1 on, layer 2's
    input from layer 3 on) beside the stream: windows of 1 and 2 layers end where the whole trunk
    does, bit for bit."""
    _, path = tiny_model("kimi-k3")
    arch = load_architecture(GGUFIndex(path))
    ids = random_ids(n_tokens=40)
    with torch.inference_mode():
        embedded = arch.embed(ids, "cpu", torch.float32)
        whole = WindowExecutor(arch, 0, 4, "cpu", torch.float32)(embedded, ids=ids)
        for size in (1, 2):
            x = embedded
            for first in range(0, 4, size):
                x = WindowExecutor(arch, first, first + size, "cpu", torch.float32)(x, ids=ids)
                assert x.shape[-1] == arch.boundary_width(first + size) == 64 * (1 + (first + size + 1) // 2)
            assert torch.equal(x, whole)


def test_kda_biases_are_refused(tiny_model, tmp_path):
    """llama.cpp's loader takes Q, K and V biases on a KDA layer, and its graph never adds them: a
    file with one is refused by name rather than computed without it."""
    _, path = tiny_model("kimi-k3")
    bad = rewrite_gguf(path, tmp_path / "bias.gguf", extra={"blk.0.attn_q.bias": (np.zeros(64, np.float32), Q.F32)})
    with pytest.raises(UserError, match="tensor blk.0.attn_q.bias is not part of the kimi-k3 layer"):
        load_architecture(GGUFIndex(bad)).load_layer(0, "cpu", torch.float32)
