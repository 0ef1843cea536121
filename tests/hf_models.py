"""Tiny random Hugging Face models, converted to GGUF by llama.cpp's own convert_hf_to_gguf.py.

The converter (from llama-cpp-python's sdist, cached outside the repository) fixes the GGUF
conventions -- tensor layouts, signs of A, norm offsets, head orders -- so our readers are
checked against the format's owner. The one thing bypassed is the tokenizer: our 384-token
byte-level BPE (Qwen2 pre-tokenizer regex, trained on pydoc topics) is unknown to its
fingerprint check, and is declared "qwen2"; a family whose converter wants a sentencepiece
file (ERNIE, Phi-3) gets the same BPE.

Weights use a larger init scale than the default so that predictions are far from uniform: a
broken layer then moves the logits instead of hiding under ln(vocab).
"""
import contextlib
import functools
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from pipeline.paths import filling
from pipeline.tools.llamacpp import llama_cpp_source

LLAMA_CPP_PYTHON = "0.3.36"
VOCAB = 384
INIT = 0.25

# one process imports the converter for every conversion of a session (each would otherwise import
# torch, transformers and the converter again), and forks a child of its own for each, since a
# conversion leaves settings on the converter's classes; it reads a JSON list of arguments per line
# and answers "ok", or what the converter logged at WARNING and above with the traceback
CONVERTER = """
import io, json, logging, os, runpy, sys, traceback
sys.path.insert(0, {llama!r})
import conversion.base
conversion.base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
conversion.base.TextModel._set_vocab_sentencepiece = conversion.base.TextModel._set_vocab_gpt2
import conversion.gemma
conversion.gemma.Gemma4Model.set_vocab = conversion.base.TextModel._set_vocab_gpt2
import conversion.deepseek
conversion.deepseek.DeepseekV32Model.set_vocab = conversion.base.TextModel._set_vocab_gpt2
import conversion.phi
conversion.phi.Phi3MiniModel.set_vocab = conversion.base.TextModel._set_vocab_gpt2
import conversion.hunyuan
conversion.hunyuan.HunYuanMoEModel.set_vocab = conversion.base.TextModel._set_vocab_gpt2
import conversion.deci
conversion.deci.DeciModel.set_vocab = conversion.base.TextModel._set_vocab_gpt2
import conversion.jamba
conversion.jamba.JambaModel.set_vocab = conversion.base.TextModel._set_vocab_gpt2
answers, sys.stdout = sys.stdout, sys.stderr     # what the converter prints goes with its log
for line in sys.stdin:
    read, write = os.pipe()
    if (child := os.fork()) == 0:
        sys.argv, log = ["convert_hf_to_gguf.py", *json.loads(line)], io.StringIO()
        logging.root.handlers[:] = [logging.StreamHandler(log)]
        try:
            runpy.run_path({llama!r} + "/convert_hf_to_gguf.py", run_name="__main__")
            answer = "ok"
        except BaseException:
            answer = log.getvalue() + traceback.format_exc()
        with os.fdopen(write, "w") as pipe:
            pipe.write(answer)
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        answer = pipe.read()
    status = os.waitpid(child, 0)[1]
    print(json.dumps(answer or f"the converting process ended with status {{status}}"), file=answers, flush=True)
"""


def write_tokenizer(out: Path, special: tuple[str, ...] = ()) -> None:
    import pydoc_data.topics

    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from pipeline.gguf_io.pre_tokenizers import QWEN2

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2.regexes[0]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    text = "\n".join(list(pydoc_data.topics.topics.values())[:40])
    tok.train_from_iterator([text], trainers.BpeTrainer(
        vocab_size=VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>", *special], show_progress=False))
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(out)


def _common(**kw) -> dict:
    return dict(vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                max_position_embeddings=512, initializer_range=INIT, tie_word_embeddings=False,
                eos_token_id=0, bos_token_id=0, pad_token_id=0, **kw)


def _deepseek(**kw) -> dict:
    """A tiny DeepSeek-V3: MLA (4 heads, nope 16 + rope 8, values 16, KV rank 32), YaRN x4 with
    mscale, one dense layer then three of sigmoid-routed experts in 4 groups of 2 (2 groups
    used) with a shared expert."""
    base = _common(intermediate_size=96, num_hidden_layers=4, moe_intermediate_size=32, n_shared_experts=1,
                   n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2, routed_scaling_factor=2.5,
                   norm_topk_prob=True, first_k_dense_replace=1, kv_lora_rank=32, qk_rope_head_dim=8,
                   qk_nope_head_dim=16, v_head_dim=16, rope_interleave=True,
                   rope_parameters=dict(YARN, mscale=0.8, mscale_all_dim=0.8))
    base.pop("head_dim")
    return base | dict(num_key_value_heads=4) | kw


def _qwen_linear(**kw) -> dict:
    return _common(linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
                   linear_num_key_heads=2, linear_num_value_heads=4,
                   layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
                   num_hidden_layers=4, **kw)


def unrotate_fourth_axis(model) -> None:
    """Qwen3-VL's text RoPE as llama.cpp computes it: ggml puts the pairs past three times each
    section on the fourth axis, whose text position is 0 (rope.text_unrotated_pairs), where
    transformers rotates them with the token's position."""
    from pipeline.model.arch.rope import text_unrotated_pairs

    rotary = model.model.language_model.rotary_emb
    pairs = text_unrotated_pairs(rotary.mrope_section, rotary.inv_freq.shape[0], interleaved=True)
    rotary.inv_freq[list(pairs)] = 0.0


def rms_eps_unread(model) -> None:
    """Qwen2-VL's RMSNorms as llama.cpp computes them: its qwen2vl loader never reads the file's
    epsilon, which stays 0."""
    for module in model.modules():
        if hasattr(module, "variance_epsilon"):
            module.variance_epsilon = 0.0


def hub_expert_layout(out: Path) -> None:
    """Qwen3-VL-MoE's experts as its published checkpoints (and so the converter) lay them out:
    gate_up_proj [E, hidden, 2 ff] and down_proj [E, ff, hidden], where transformers 5 saves
    their transposes."""
    from safetensors.torch import load_file, save_file

    path = out / "model.safetensors"
    tensors = load_file(path)
    for name in tensors:
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            tensors[name] = tensors[name].transpose(1, 2).contiguous()
    save_file(tensors, path, metadata={"format": "pt"})


def minimax_hub_layout(out: Path, version: int = 2) -> None:
    """MiniMax's experts as its published checkpoints (and so the converter) hold them: one w1
    (gate), w3 (up) and w2 (down) per expert under block_sparse_moe, beside its gate and selection
    bias, where transformers 5 saves stacked mlp.experts tensors. MiniMax-M3's (version 3) also:
    the dense and shared MLPs' gate and up apart (the dense one under `mlp`), the selection bias
    beside the gate, the indexer's tensors as `index_*`."""
    import re

    from safetensors.torch import load_file, save_file

    path = out / "model.safetensors"
    hub = {}
    for name, t in load_file(path).items():
        if version == 3:
            name = re.sub(r"self_attn\.indexer\.(q|k)_(proj|norm)", r"self_attn.index_\1_\2", name)
            name = name.replace(".mlp.shared_experts.", ".block_sparse_moe.shared_experts.").replace(
                ".mlp.gate.e_score_correction_bias", ".block_sparse_moe.e_score_correction_bias")
            if name.endswith("gate_up_proj.weight"):      # a dense or shared MLP's [2 ff, hidden]
                base = name.removesuffix("gate_up_proj.weight")
                hub[base + "gate_proj.weight"], hub[base + "up_proj.weight"] = t.chunk(2, dim=0)
                continue
        prefix, _, rest = name.partition(".mlp.")
        if not rest or rest == "down_proj.weight":          # not the experts' (M3's dense MLP)
            hub[name] = t
        elif rest == "experts.gate_up_proj":          # [E, 2 ff, hidden]: gate rows, then up rows
            gate, up = t.chunk(2, dim=1)
            for e in range(t.shape[0]):
                hub[f"{prefix}.block_sparse_moe.experts.{e}.w1.weight"] = gate[e].contiguous()
                hub[f"{prefix}.block_sparse_moe.experts.{e}.w3.weight"] = up[e].contiguous()
        elif rest == "experts.down_proj":             # [E, hidden, ff]
            for e in range(t.shape[0]):
                hub[f"{prefix}.block_sparse_moe.experts.{e}.w2.weight"] = t[e].contiguous()
        else:
            hub[f"{prefix}.block_sparse_moe.{rest}"] = t
    save_file({k: v.contiguous() for k, v in hub.items()}, path, metadata={"format": "pt"})


def minimax01_hub_layout(out: Path) -> None:
    """MiniMax-Text-01's checkpoint as published (transformers 5 saves its experts so already):
    without the lightning layers' decay tables, which transformers saves as buffers and the
    converter cannot map (they follow from the config), and with the shard index its converter reads
    the embedding through."""
    from safetensors.torch import load_file, save_file

    path = out / "model.safetensors"
    tensors = {k: v for k, v in load_file(path).items() if not k.endswith(("_decay", ".slope_rate"))}
    save_file(tensors, path, metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": dict.fromkeys(tensors, path.name)}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))


def bailing_moe_v2(config: dict, out: Path) -> None:
    """A random BailingMoeV2ForCausalLM checkpoint as its modeling code names the weights
    (transformers has no such class): its trunk, then the multi-token-prediction layers."""
    from safetensors.torch import save_file

    c = config
    H, D, NH, NKV, E = (c[k] for k in ("hidden_size", "head_dim", "num_attention_heads", "num_key_value_heads",
                                       "num_experts"))
    rand = lambda *shape: torch.randn(*shape) * INIT  # noqa: E731
    norm = lambda n: 1 + rand(n)  # noqa: E731

    def mlp(prefix: str, width: int) -> dict:
        return {f"{prefix}.gate_proj.weight": rand(width, H), f"{prefix}.up_proj.weight": rand(width, H),
                f"{prefix}.down_proj.weight": rand(H, width)}

    w = {"model.word_embeddings.weight": rand(c["vocab_size"], H), "model.norm.weight": norm(H),
         "lm_head.weight": rand(c["vocab_size"], H)}
    for i in range(c["num_hidden_layers"] + c["num_nextn_predict_layers"]):
        p = f"model.layers.{i}"
        w |= {f"{p}.input_layernorm.weight": norm(H), f"{p}.post_attention_layernorm.weight": norm(H),
              f"{p}.attention.query_key_value.weight": rand((NH + 2 * NKV) * D, H),
              f"{p}.attention.query_layernorm.weight": norm(D), f"{p}.attention.key_layernorm.weight": norm(D),
              f"{p}.attention.dense.weight": rand(H, NH * D)}
        if i < c["first_k_dense_replace"]:
            w |= mlp(f"{p}.mlp", c["intermediate_size"])
            continue
        w |= {f"{p}.mlp.gate.weight": rand(E, H), f"{p}.mlp.gate.expert_bias": rand(E),
              **mlp(f"{p}.mlp.shared_experts", c["moe_shared_expert_intermediate_size"])}
        for e in range(E):
            w |= mlp(f"{p}.mlp.experts.{e}", c["moe_intermediate_size"])
        if i >= c["num_hidden_layers"]:
            w |= {f"{p}.enorm.weight": norm(H), f"{p}.hnorm.weight": norm(H), f"{p}.eh_proj.weight": rand(H, 2 * H),
                  f"{p}.final_layernorm.weight": norm(H)}
    out.mkdir(parents=True, exist_ok=True)
    save_file(w, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(c, indent=1))


def deci_block(heads_in_group: int | None = None, linear: bool = False, ffn_mult: float | None = None) -> dict:
    """One entry of DeciLM's block_configs: attention with `heads_in_group` query heads per KV head,
    one linear map (`linear`) or none; a SwiGLU FFN of `ffn_mult`, or none."""
    return {"attention": {"n_heads_in_group": heads_in_group, "no_op": heads_in_group is None and not linear,
                          "replace_with_linear": linear},
            "ffn": {"ffn_mult": ffn_mult, "no_op": ffn_mult is None, "replace_with_linear": False}}


def deci_lm(config: dict, out: Path) -> None:
    """A random DeciLMForCausalLM checkpoint (Nemotron-51B, Super, Ultra) as its modeling code names the
    weights (transformers has no such class), each layer as its block_configs entry says."""
    from safetensors.torch import save_file

    c = config
    H, NH, D, V = c["hidden_size"], c["num_attention_heads"], c["head_dim"], c["vocab_size"]
    rand = lambda *shape: torch.randn(*shape) * INIT  # noqa: E731
    norm = lambda n: 1 + rand(n)  # noqa: E731
    w = {"model.embed_tokens.weight": rand(V, H), "model.norm.weight": norm(H), "lm_head.weight": rand(V, H)}
    for i, block in enumerate(c["block_configs"]):
        p, attention, ffn = f"model.layers.{i}", block["attention"], block["ffn"]
        if attention["replace_with_linear"]:
            w |= {f"{p}.input_layernorm.weight": norm(H), f"{p}.self_attn.linear_attn.weight": rand(H, H)}
        elif not attention["no_op"]:
            KV = NH // attention["n_heads_in_group"]
            w |= {f"{p}.input_layernorm.weight": norm(H), f"{p}.self_attn.q_proj.weight": rand(NH * D, H),
                  f"{p}.self_attn.k_proj.weight": rand(KV * D, H), f"{p}.self_attn.v_proj.weight": rand(KV * D, H),
                  f"{p}.self_attn.o_proj.weight": rand(H, NH * D)}
        if not ffn["no_op"]:
            width = -(-int(2 * ffn["ffn_mult"] * H / 3) // 256) * 256   # DeciLM's: a multiple of 256
            w |= {f"{p}.post_attention_layernorm.weight": norm(H), f"{p}.mlp.gate_proj.weight": rand(width, H),
                  f"{p}.mlp.up_proj.weight": rand(width, H), f"{p}.mlp.down_proj.weight": rand(H, width)}
    out.mkdir(parents=True, exist_ok=True)
    save_file(w, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(c, indent=1))


# Grok's published checkpoint layouts, as its converter maps them: role -> name, {i} the layer, {e}
# the expert. Grok-1 (keyfan/grok-1-hf) ties its head to the embedding; Grok-2 (xai-org/grok-2) has
# its own, and a dense MLP beside the experts (residual_moe)
GROK_LAYOUTS = {
    "grok-1": dict(
        embed="transformer.in_out_embed.weight", norm="transformer.rms_norm.weight", head=None,
        attn_norm="transformer.decoder_layer.{i}.rms_norm.weight",
        q="transformer.decoder_layer.{i}.multi_head_attention.query.weight",
        k="transformer.decoder_layer.{i}.multi_head_attention.key.weight",
        v="transformer.decoder_layer.{i}.multi_head_attention.value.weight",
        o="transformer.decoder_layer.{i}.multi_head_attention.linear.weight",
        attn_post_norm="transformer.decoder_layer.{i}.rms_norm_1.weight",
        ffn_norm="transformer.decoder_layer.{i}.rms_norm_2.weight",
        ffn_post_norm="transformer.decoder_layer.{i}.rms_norm_3.weight",
        router="transformer.decoder_layer.{i}.router.weight",
        gate="transformer.decoder_layer.{i}.moe.{e}.linear.weight",
        up="transformer.decoder_layer.{i}.moe.{e}.linear_v.weight",
        down="transformer.decoder_layer.{i}.moe.{e}.linear_1.weight"),
    "grok-2": dict(
        embed="model.embed_tokens.weight", norm="model.norm.weight", head="lm_head.weight",
        attn_norm="model.layers.{i}.pre_attn_norm.weight", q="model.layers.{i}.self_attn.q_proj.weight",
        k="model.layers.{i}.self_attn.k_proj.weight", v="model.layers.{i}.self_attn.v_proj.weight",
        o="model.layers.{i}.self_attn.o_proj.weight", attn_post_norm="model.layers.{i}.post_attn_norm.weight",
        ffn_norm="model.layers.{i}.pre_moe_norm.weight", ffn_post_norm="model.layers.{i}.post_moe_norm.weight",
        router="model.layers.{i}.block_sparse_moe.gate.weight",
        gate="model.layers.{i}.block_sparse_moe.experts.{e}.w1.weight",
        up="model.layers.{i}.block_sparse_moe.experts.{e}.w3.weight",
        down="model.layers.{i}.block_sparse_moe.experts.{e}.w2.weight",
        mlp_gate="model.layers.{i}.mlp.gate_proj.weight", mlp_up="model.layers.{i}.mlp.up_proj.weight",
        mlp_down="model.layers.{i}.mlp.down_proj.weight"),
}


def grok_layout(config: dict) -> dict:
    """The layout of a Grok config: Grok-2's where it has the dense MLP beside the experts."""
    return GROK_LAYOUTS["grok-2" if config.get("residual_moe") else "grok-1"]


def grok_checkpoint(config: dict, out: Path) -> None:
    """A random Grok checkpoint in its published layout (transformers has no Grok class), with the chat
    template that the converter requires beside a tokenizer.json."""
    from safetensors.torch import save_file

    c, names = config, grok_layout(config)
    H, NH, NKV, E = (c[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "num_local_experts"))
    D, FF = c.get("head_dim", H // NH), c["intermediate_size"]
    FF_EXP = c.get("moe_intermediate_size", FF)    # Grok-1's experts: intermediate_size wide
    rand = lambda *shape: torch.randn(*shape) * INIT  # noqa: E731
    norm = lambda: 1 + rand(H)  # noqa: E731

    w = {names["embed"]: rand(c["vocab_size"], H), names["norm"]: norm()}
    if names["head"]:
        w[names["head"]] = rand(c["vocab_size"], H)
    for i in range(c["num_hidden_layers"]):
        name = lambda role, e=0: names[role].format(i=i, e=e)  # noqa: E731
        w |= {name("attn_norm"): norm(), name("q"): rand(NH * D, H), name("k"): rand(NKV * D, H),
              name("v"): rand(NKV * D, H), name("o"): rand(H, NH * D), name("attn_post_norm"): norm(),
              name("ffn_norm"): norm(), name("ffn_post_norm"): norm(), name("router"): rand(E, H)}
        for e in range(E):
            w |= {name("gate", e): rand(FF_EXP, H), name("up", e): rand(FF_EXP, H), name("down", e): rand(H, FF_EXP)}
        if c.get("residual_moe"):
            w |= {name("mlp_gate"): rand(FF, H), name("mlp_up"): rand(FF, H), name("mlp_down"): rand(H, FF)}
    out.mkdir(parents=True, exist_ok=True)
    save_file(w, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(c, indent=1))
    (out / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
def kimi_k3(config: dict, out: Path) -> None:
    """A random Kimi-K3 checkpoint as published (transformers has no such class): its text config
    under text_config, its weights under `language_model.` as the modeling code names them (KDA on
    the layers linear_attn_config does not list as full attention, 1-indexed), each attention
    residual's norm and projection apart, the experts one by one (w1 gate, w2 down, w3 up) in the
    latent space between the routed projections."""
    from safetensors.torch import save_file

    c, kda = config, config["linear_attn_config"]
    H, NH, E, L = c["hidden_size"], c["num_attention_heads"], c["num_experts"], c["routed_expert_hidden_size"]
    dk, inner, nope, rope = kda["head_dim"], NH * kda["head_dim"], c["qk_nope_head_dim"], c["qk_rope_head_dim"]
    rank, v, qr, ff = c["kv_lora_rank"], c["v_head_dim"], c["q_lora_rank"], c["moe_intermediate_size"]
    rand = lambda *shape: torch.randn(*shape) * INIT  # noqa: E731
    norm = lambda n: 1 + rand(n)  # noqa: E731

    def mlp(prefix: str, width: int) -> dict:
        return {f"{prefix}.gate_proj.weight": rand(width, H), f"{prefix}.up_proj.weight": rand(width, H),
                f"{prefix}.down_proj.weight": rand(H, width)}

    def residual(prefix: str) -> dict:
        return {f"{prefix}_res_norm.weight": norm(H), f"{prefix}_res_proj.weight": rand(1, H)}

    m = "language_model.model"
    w = {f"{m}.embed_tokens.weight": rand(c["vocab_size"], H), f"{m}.norm.weight": norm(H),
         "language_model.lm_head.weight": rand(c["vocab_size"], H), **residual(f"{m}.output_attn")}
    for i in range(c["num_hidden_layers"]):
        p = f"{m}.layers.{i}"
        w |= {f"{p}.input_layernorm.weight": norm(H), f"{p}.post_attention_layernorm.weight": norm(H),
              **residual(f"{p}.self_attention"), **residual(f"{p}.mlp")}
        a = f"{p}.self_attn"
        if i + 1 in kda["full_attn_layers"]:
            w |= {f"{a}.q_a_proj.weight": rand(qr, H), f"{a}.q_a_layernorm.weight": norm(qr),
                  f"{a}.q_b_proj.weight": rand(NH * (nope + rope), qr),
                  f"{a}.kv_a_proj_with_mqa.weight": rand(rank + rope, H), f"{a}.kv_a_layernorm.weight": norm(rank),
                  f"{a}.kv_b_proj.weight": rand(NH * (nope + v), rank), f"{a}.g_proj.weight": rand(NH * v, H),
                  f"{a}.o_proj.weight": rand(H, NH * v)}
        else:
            w |= {f"{a}.{x}_proj.weight": rand(inner, H) for x in "qkv"}
            w |= {f"{a}.{x}_conv1d.weight": rand(inner, 1, kda["short_conv_kernel_size"]) * 2 for x in "qkv"}
            w |= {f"{a}.f_a_proj.weight": rand(dk, H), f"{a}.f_b_proj.weight": rand(inner, dk),
                  f"{a}.b_proj.weight": rand(NH, H), f"{a}.A_log": torch.rand(NH) * 2 - 1, f"{a}.dt_bias": rand(inner),
                  f"{a}.g_proj.weight": rand(inner, H), f"{a}.o_norm.weight": norm(dk),
                  f"{a}.o_proj.weight": rand(H, inner)}
        if i < c["first_k_dense_replace"]:
            w |= mlp(f"{p}.mlp", c["intermediate_size"])
            continue
        moe = f"{p}.block_sparse_moe"
        w |= {f"{moe}.gate.weight": rand(E, H), f"{moe}.gate.e_score_correction_bias": rand(E),
              f"{moe}.routed_expert_down_proj.weight": rand(L, H), f"{moe}.routed_expert_norm.weight": norm(L),
              f"{moe}.routed_expert_up_proj.weight": rand(H, L),
              **mlp(f"{moe}.shared_experts", ff * c["num_shared_experts"])}
        for e in range(E):
            w |= {f"{moe}.experts.{e}.w1.weight": rand(ff, L), f"{moe}.experts.{e}.w2.weight": rand(L, ff),
                  f"{moe}.experts.{e}.w3.weight": rand(ff, L)}
    out.mkdir(parents=True, exist_ok=True)
    save_file(w, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps({"architectures": ["KimiK3ForConditionalGeneration"],
                                                 "model_type": "kimi_k3", "text_config": c}, indent=1))


def wide_expert_gates(model) -> None:
    """gpt-oss experts whose gate and up projections often pass the SwiGLU clamp (+-7)."""
    for layer in model.model.layers:
        layer.mlp.experts.gate_up_proj.mul_(4)


def llama_cpp_ties(model) -> None:
    """DeepSeek Sparse Attention's top-k as llama.cpp breaks ties at the k-th score (its heap
    selection, pipeline/model/arch/heap_select.py), where transformers' topk keeps other tied keys."""
    import contextlib

    from pipeline.model.arch.heap_select import heap_select

    topk = torch.Tensor.topk

    def llama_topk(scores, k, dim=-1, **kw):   # scores [B, queries, keys], -inf past each query
        ranked = topk(scores, min(k + 1, scores.shape[-1]), dim=dim, **kw)
        indices = ranked.indices[..., :k].clone()
        if ranked.values.shape[-1] > k:
            for row, query in (ranked.values[..., k - 1] == ranked.values[..., k]).nonzero().tolist():
                indices[row, query] = torch.tensor(heap_select(scores[row, query].tolist(), k))
        return torch.return_types.topk((ranked.values[..., :k], indices))

    @contextlib.contextmanager
    def llama_selection():
        torch.Tensor.topk = llama_topk
        try:
            yield
        finally:
            torch.Tensor.topk = topk

    for layer in model.model.layers:
        if (indexer := layer.self_attn.indexer) is not None:   # GLM-5.2's shared layers have none
            indexer.forward = llama_selection()(indexer.forward)


def dots3_hub_config(out: Path) -> None:
    """dots3's config.json as published (and so as the converter reads it, raw): the sliding layers'
    geometry under swa_* keys and the RoPE bases at the top, where transformers' config nests them
    (per_layer_config, rope_parameters per layer type); the flags its converter checks, and the
    latents' rescale, which transformers always applies, folded into their norms."""
    path = out / "config.json"
    cfg = json.loads(path.read_text())
    sliding = cfg["layer_types"].index("sliding_attention")
    swa = cfg.pop("per_layer_config")[str(sliding)]
    rope = cfg.pop("rope_parameters")
    cfg.update({f"swa_{k}": swa.get(k, cfg[k]) for k in (
        "num_attention_heads", "num_key_value_heads", "q_lora_rank", "kv_lora_rank", "head_dim", "qk_nope_head_dim",
        "qk_rope_head_dim", "v_head_dim")})
    cfg.update(sliding_window_size=cfg["sliding_window"], rope_theta=rope["indexed_attention"]["rope_theta"],
               swa_rope_theta=rope["sliding_attention"]["rope_theta"],
               first_k_dense_replace=cfg["mlp_layer_types"].index("sparse"), scoring_func="sigmoid",
               topk_method="noaux_tc", use_dsa=True, k_rope_only_layernorm=True, apply_mla_qkv_lora_rescale=True,
               model_type="dots3_note_hub")   # unknown to AutoConfig: the converter reads the file as it is
    path.write_text(json.dumps(cfg, indent=1))


def llama_cpp_dots3_indexer(model) -> None:
    """dots3's indexer as llama.cpp's graph computes it: its q and k rotated half the rotated width
    apart (ggml's NEOX) on their first qk_rope_head_dim values, where transformers rotates consecutive
    pairs (the converter leaves the indexer's weights as they are); ties at the top_k-th score broken
    as ggml's heap selection breaks them (llama_cpp_ties)."""
    import contextlib

    from transformers.models.dots3_note import modeling_dots3_note as m

    def neox(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        return q * cos + m.rotate_half(q) * sin, k * cos + m.rotate_half(k) * sin

    @contextlib.contextmanager
    def neox_rope():
        interleaved, m.apply_rotary_pos_emb_interleave = m.apply_rotary_pos_emb_interleave, neox
        try:
            yield
        finally:
            m.apply_rotary_pos_emb_interleave = interleaved

    llama_cpp_ties(model)
    for layer in model.model.layers:
        if (indexer := layer.self_attn.indexer) is not None:
            indexer.forward = neox_rope()(indexer.forward)


def sharper_head(model) -> None:
    """An LM head three times the initial scale: the final mixer averages sigmoid-gated streams,
    which leaves the logits of a random Qwen4-Exp too flat to show a broken layer."""
    model.lm_head.weight.mul_(3)


def llama_cpp_qsa(model) -> None:
    """Qwen4-Exp's query-sparse selection as llama.cpp makes it: ggml's top-k of the keys, each
    scored as its block, over budget + ratio - 1 slots, so that the slots the tail leaves take keys
    of the next-best block (its heap selection picks which, heap_select.py); transformers keeps the
    best whole blocks and the tail only. The indexer's forward is replaced (transformers 5.24 selects
    inside it, 5.25 in a method of its own); its queries, keys and blocks' scores are transformers'
    own parts and formulas."""
    import math
    from types import MethodType

    from transformers.models.qwen4_exp.modeling_qwen4_exp import apply_rotary_pos_emb

    from pipeline.model.arch.heap_select import heap_select

    def forward(indexer, hidden_states, position_embeddings, attention_mask, cache=None, **kwargs):
        B, T, _ = hidden_states.shape
        r, width, D = indexer.compress_ratio, indexer.token_budget + indexer.compress_ratio - 1, indexer.index_head_dim
        cos, sin = position_embeddings
        q, raw_keys = indexer.index_qk_proj(hidden_states).split([indexer.index_n_heads * D, D], dim=-1)
        q = apply_rotary_pos_emb(indexer.q_layernorm(q.reshape(B, T, -1, D)), cos=cos, sin=sin, unsqueeze_dim=2)
        selected = torch.zeros(B, 1, T, attention_mask.shape[-1], dtype=torch.bool)
        for b in range(B):
            for t in range(T):
                if t < width:
                    selected[b, 0, t, :t + 1] = True
                    continue
                n_blocks = (t + 1) // r
                keys = raw_keys[b, :n_blocks * r].view(n_blocks, r, -1).float().mean(1)
                starts = torch.arange(n_blocks) * r
                keys = apply_rotary_pos_emb(indexer.k_layernorm(keys).unsqueeze(1), cos=cos[b, starts],
                                            sin=sin[b, starts]).squeeze(1)
                block = torch.relu(q[b, t].float() @ keys.float().T).sum(0) / math.sqrt(D)
                row = block.repeat_interleave(r).tolist() + [math.inf] * (t + 1 - n_blocks * r)
                selected[b, 0, t, heap_select(row, width)] = True
        return selected

    for layer in model.model.layers:
        if getattr(layer, "self_attn", None) is not None:
            layer.self_attn.indexer.forward = MethodType(forward, layer.self_attn.indexer)


def kimi_hub_layout(out: Path) -> None:
    """Kimi-Linear's dense MLP under `mlp`, as its published checkpoints (and so the converter)
    name it, where transformers 5 saves it under the experts' `block_sparse_moe`."""
    import re

    from safetensors.torch import load_file, save_file

    path = out / "model.safetensors"
    tensors = {re.sub(r"block_sparse_moe\.(gate|up|down)_proj", r"mlp.\1_proj", name): t
               for name, t in load_file(path).items()}
    save_file(tensors, path, metadata={"format": "pt"})


def step35_hub_config(out: Path) -> None:
    """Step-3.7-Flash's config.json as published (and so as the converter reads it, raw): the text
    trunk's keys under their hub names, which transformers' config renames or drops."""
    path = out / "config.json"
    cfg = json.loads(path.read_text())
    text = cfg["text_config"]
    rope = text["rope_parameters"]
    text.update(attention_other_setting={"num_attention_heads": text["num_sliding_attention_heads"],
                                         "num_attention_groups": text["num_key_value_heads"]},
                num_attention_groups=text["num_key_value_heads"], moe_num_experts=text["n_routed_experts"],
                moe_top_k=text["num_experts_per_tok"], norm_expert_weight=True,
                moe_layers_enum=",".join(str(i) for i, kind in enumerate(text["mlp_layer_types"]) if kind == "sparse"),
                rope_theta=[rope[kind]["rope_theta"] for kind in text["layer_types"]],
                partial_rotary_factors=[rope[kind]["partial_rotary_factor"] for kind in text["layer_types"]])
    cfg["model_type"] = "step3p7_hub"   # unknown to AutoConfig: the converter reads the file as it is
    path.write_text(json.dumps(cfg, indent=1))


def ling_mtp_layer(out: Path) -> None:
    """Ling 3's multi-token-prediction layer after the trunk, as its published checkpoints hold it
    (transformers neither builds nor saves it): an MLA and experts layer (the last trunk layer's
    weights, copied) with the embedding and hidden norms, their projection and a final norm."""
    import re

    from safetensors.torch import load_file, save_file

    path, cfg = out / "model.safetensors", json.loads((out / "config.json").read_text())
    tensors, n, H = load_file(path), cfg["num_hidden_layers"], cfg["hidden_size"]
    for name, t in list(tensors.items()):
        if name.startswith(f"model.layers.{n - 1}."):
            tensors[re.sub(r"^model\.layers\.\d+\.", f"model.layers.{n}.", name)] = t.clone()
    p = f"model.layers.{n}"
    tensors |= {f"{p}.enorm.weight": 1 + torch.randn(H) * INIT, f"{p}.hnorm.weight": 1 + torch.randn(H) * INIT,
                f"{p}.eh_proj.weight": torch.randn(H, 2 * H) * INIT,
                f"{p}.final_layernorm.weight": 1 + torch.randn(H) * INIT}
    save_file(tensors, path, metadata={"format": "pt"})


def gemma4_scalars(model) -> None:
    """Gemma 4's scalars away from their initial 1: each layer's output scalar, the router's
    input scale and each expert's output scale, so that each shows."""
    for name, t in [*model.named_buffers(), *model.named_parameters()]:
        if name.endswith(("layer_scalar", "router.scale", "router.per_expert_scale")):
            t.copy_(0.5 + torch.rand_like(t))


def per_expert_layout(out: Path) -> None:
    """Experts as Hunyuan's and Hy3's published checkpoints (and so their converters, which stack
    them again) hold them: one gate_proj, up_proj and down_proj per expert under mlp.experts.N,
    where transformers 5 saves stacked mlp.experts.gate_up_proj [E, 2 ff, hidden] (gate rows, then
    up rows) and mlp.experts.down_proj [E, hidden, ff]."""
    from safetensors.torch import load_file, save_file

    path = out / "model.safetensors"
    hub = {}
    for name, t in load_file(path).items():
        prefix, _, rest = name.partition(".mlp.experts.")
        if rest == "gate_up_proj":
            gate, up = t.chunk(2, dim=1)
            for e in range(t.shape[0]):
                hub[f"{prefix}.mlp.experts.{e}.gate_proj.weight"] = gate[e].contiguous()
                hub[f"{prefix}.mlp.experts.{e}.up_proj.weight"] = up[e].contiguous()
        elif rest == "down_proj":
            for e in range(t.shape[0]):
                hub[f"{prefix}.mlp.experts.{e}.down_proj.weight"] = t[e].contiguous()
        else:
            hub[name] = t
    save_file(hub, path, metadata={"format": "pt"})


def hunyuan_hub_layout(out: Path) -> None:
    """Hunyuan-A13B's checkpoint as published: per-expert tensors (per_expert_layout), and the per-layer
    lists its converter reads from config.json (moe_intermediate_size, moe_topk, num_shared_expert),
    where transformers' config holds one value (its experts are intermediate_size wide)."""
    per_expert_layout(out)
    path = out / "config.json"
    cfg = json.loads(path.read_text())
    n = cfg["num_hidden_layers"]
    cfg.update(moe_intermediate_size=[cfg["intermediate_size"]] * n, moe_topk=[cfg["moe_topk"]] * n,
               num_shared_expert=[1] * n)
    path.write_text(json.dumps(cfg, indent=1))


def hy3_with_mtp(out: Path) -> None:
    """Hy3's checkpoint as published: per-expert tensors (per_expert_layout), and one
    multi-token-prediction block after the trunk (model.layers.N: a sparse decoder layer, its
    enorm, hnorm, eh_proj and final_layernorm), which transformers' HYV3 has no module for; a
    perplexity pass never runs it (llama.cpp loads and skips it)."""
    from safetensors.torch import load_file, save_file

    per_expert_layout(out)
    path = out / "model.safetensors"
    w = load_file(path)
    n, H = json.loads((out / "config.json").read_text())["num_hidden_layers"], w["model.embed_tokens.weight"].shape[1]
    src = f"model.layers.{n - 1}."
    g = torch.Generator().manual_seed(5)
    for name, t in list(w.items()):
        if name.startswith(src):
            w[f"model.layers.{n}." + name[len(src):]] = t + torch.randn(t.shape, generator=g) * INIT
    for kind in ("enorm", "hnorm", "final_layernorm"):
        w[f"model.layers.{n}.{kind}.weight"] = 1 + torch.randn(H, generator=g) * INIT
    w[f"model.layers.{n}.eh_proj.weight"] = torch.randn(H, 2 * H, generator=g) * INIT
    save_file(w, path, metadata={"format": "pt"})


def exaone_moe_with_mtp(out: Path) -> None:
    """K-EXAONE's checkpoint as published: per-expert tensors (per_expert_layout), and its
    multi-token-prediction block under mtp.* (a dense decoder layer, the projection joining the
    embedding and the hidden state, their two norms and a final norm), which transformers' ExaoneMoe
    drops on loading; a perplexity pass never runs it (llama.cpp loads and skips it)."""
    from safetensors.torch import load_file, save_file

    per_expert_layout(out)
    path = out / "model.safetensors"
    w = load_file(path)
    H = w["model.embed_tokens.weight"].shape[1]
    g = torch.Generator().manual_seed(5)
    for name, t in list(w.items()):
        if name.startswith("model.layers.0."):   # the dense layer's shapes
            w["mtp.layers.0." + name.removeprefix("model.layers.0.")] = t + torch.randn(t.shape, generator=g) * INIT
    for kind in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        w[f"mtp.{kind}.weight"] = 1 + torch.randn(H, generator=g) * INIT
    w["mtp.fc.weight"] = torch.randn(H, 2 * H, generator=g) * INIT
    save_file(w, path, metadata={"format": "pt"})


def hy4_hub_layout(out: Path) -> None:
    """Hy4's tensors under their published names, which its converter maps: transformers 5 saves
    the iHC tensors as hc_pre.hc_attn_layer.hc_fn (its renaming reversed at the wrong place) where the
    hub has hc_attn_layer.hc_pre.hc_fn, the head's as model.hc_pre.hc_head.* for model.hc_head.*,
    and the dense and shared MLPs' gate_proj as linear_gate (the attention gate's hub name)."""
    import re

    from safetensors.torch import load_file, save_file

    path = out / "model.safetensors"
    hub = {}
    for name, t in load_file(path).items():
        name = re.sub(r"\.hc_pre\.(hc_attn_layer|hc_mlp_layer)\.", r".\1.hc_pre.", name)
        name = name.replace("model.hc_pre.hc_head.", "model.hc_head.")
        name = re.sub(r"\.mlp\.(shared_experts\.)?linear_gate\.", r".mlp.\1gate_proj.", name)
        hub[name] = t
    save_file(hub, path, metadata={"format": "pt"})


def hy4_params(model) -> None:
    """Hy4's sinks and iHC scales and biases away from their initial values (0, 0.01, -ln 3), so
    that each shows."""
    for name, t in model.named_parameters():
        if name.endswith("sinks"):
            t.copy_(torch.randn_like(t))
        elif name.endswith(("hc.scale", "hc_scale")):
            t.copy_(0.5 + torch.rand_like(t))
        elif name.endswith(("hc.base", "hc_base")):
            t.add_(torch.randn_like(t) * INIT)


def glm5next_params(model) -> None:
    """GLM-5.3-Flash's KDA A_log, Sinkhorn scales and biases and k-pool gate and positions away from
    their initial values (0, 1, 0, all ones: one softmax for every channel, 0), so that each shows."""
    for name, t in model.named_parameters():
        if name.endswith(("A_log", "hc.base", "index_kpool_compress_ape", "index_kpool_compress_gate")):
            t.copy_(torch.randn_like(t) * INIT)
        elif name.endswith("hc.scale"):
            t.copy_(0.5 + torch.rand_like(t))


def xielu_per_layer(model) -> None:
    """Apertus's xIELU parameters apart on each layer (transformers starts every layer at alpha_p 0.8,
    alpha_n 0.8, beta 0.5), so that a layer's own read shows."""
    for mlp in (layer.mlp for layer in model.model.layers):
        act = mlp.act_fn
        act.alpha_p.add_(torch.randn_like(act.alpha_p))
        act.alpha_n.add_(torch.randn_like(act.alpha_n))
        act.beta.copy_(0.25 + 0.5 * torch.rand_like(act.beta))


# the smallest Qwen3-VL vision tower: the converter takes the text trunk and its deepstack count
TINY_VISION = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64,
                   deepstack_visual_indexes=[0])
TINY_QWEN2_5_VISION = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64,
                           fullatt_block_indexes=[0])
TINY_GLM5NEXT_VISION = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64,
                            projection_intermediate_size=64)
TINY_STEP_VISION = dict(width=32, layers=1, heads=2, image_size=28, patch_size=14)
TINY_MUSE_VISION = dict(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=64)


@dataclass
class Spec:
    config: str                       # transformers config class
    kwargs: dict
    raw_config: dict = field(default_factory=dict)   # keys written into config.json for the converter
    drop_keys: tuple = ()                            # keys removed from config.json for the converter
    convert_args: tuple = ()
    special_tokens: tuple = ()                       # added to the tokenizer (a converter may look them up)
    multimodal: str = ""             # a transformers class with a vision tower: `kwargs` are its text_config
    vision: dict = field(default_factory=lambda: TINY_VISION)   # ... and this its vision_config
    outer: dict = field(default_factory=dict)                    # ... and these keys of its own
    reference: object = None         # applied to the transformers model, where llama.cpp defines the file otherwise
    checkpoint: object = None        # applied to the saved checkpoint's folder, for the converter
    prepare: object = None           # applied to the random model before it is saved
    causal_lm: str = ""              # the transformers class, where AutoModelForCausalLM does not map the config
    writer: object = None            # writes config.json and the weights itself, for a family transformers lacks


# Gemma 4's two RoPEs: sliding layers' default, global layers' proportional (half of each head
# rotated); low bases, so that rotating or not shows
GEMMA4_ROPE = {"sliding_attention": dict(rope_type="default", rope_theta=100.0),
               "full_attention": dict(rope_type="proportional", partial_rotary_factor=0.5, rope_theta=1000.0)}
YARN = dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=128, rope_theta=10000.0)
PHI3_TOKENS = ("</s>", "<unk>", "<s>")   # llama.cpp's vocabulary loader looks them up in a Phi-3 file
# as Qwen4-Exp's checkpoints name them, and its converter reads them (transformers' config calls the
# attention layers "indexed_attention", which the converter would take for dense ones)
QWEN4EXP_LAYERS = ["linear_attention", "full_attention", "linear_attention", "full_attention"]
# GLM-5.3-Flash's, as transformers names them (its converter gives each but linear_attention a KV head)
GLM5NEXT_LAYERS = ["linear_attention", "indexed_attention", "indexed_attention", "linear_attention"]
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True)
SPECS = {
    # transformers' DeepSeek-V3 always routes by sigmoid and leaves scoring_func out of
    # config.json; without it the converter writes no gating function and llama.cpp routes by
    # softmax, as for DeepSeek-V2 files
    "deepseek2": Spec("DeepseekV3Config", _deepseek(q_lora_rank=48), raw_config={"scoring_func": "sigmoid"}),
    # "lite": queries from one projection, no q_lora_rank
    "deepseek2_lite": Spec("DeepseekV3Config", _deepseek(q_lora_rank=None), raw_config={"scoring_func": "sigmoid"}),
    # GLM-4.5: partial RoPE, QKV bias, QK-norm, one dense layer, sigmoid routing with a shared
    # expert; the converter looks up GLM's special tokens
    "glm4moe": Spec("Glm4MoeConfig", _common(
        intermediate_size=96, num_hidden_layers=4, moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2,
        n_shared_experts=1, n_group=1, topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True,
        first_k_dense_replace=1, use_qk_norm=True, attention_bias=True, num_nextn_predict_layers=0,
        rope_parameters=dict(rope_theta=10000.0, partial_rotary_factor=0.5, rope_type="default")),
        special_tokens=("[gMASK]", "<|user|>", "<|observation|>")),
    # Ministral 3: YaRN with mscale_all_dim 2 and beta_fast 2 (which moves the ramp's start at this
    # size), the attention temperature past the original 64 positions (beta 0.5: the tests score 150)
    "mistral3": Spec("Ministral3Config", _common(intermediate_size=96, num_hidden_layers=3, rope_parameters=dict(
        rope_type="yarn", factor=4.0, original_max_position_embeddings=64, rope_theta=10000.0, beta_fast=2.0,
        beta_slow=1.0, mscale=1.0, mscale_all_dim=2.0, llama_4_scaling_beta=0.5)),
        raw_config={"architectures": ["Ministral3ForCausalLM"]}),
    # Mistral 4: DeepSeek-V3's graph (MLA, YaRN with mscale_all_dim, interleaved RoPE) with
    # softmax routing in groups beside a shared expert, under Mistral's converter; that converter
    # writes no Llama-4 temperature for it and llama.cpp computes none: beta 0 in transformers.
    # YaRN's mscale and mscale_all_dim 1, as published: the file carries only the second, and
    # llama.cpp takes the first to be 1 for this architecture (transformers' attention scale
    # disagrees with llama.cpp's where they differ)
    "mistral4": Spec("Mistral4Config", _deepseek(q_lora_rank=48, rope_parameters=dict(
        YARN, mscale=1.0, mscale_all_dim=1.0, llama_4_scaling_beta=0.0)),
        raw_config={"architectures": ["Ministral3ForCausalLM"]}, causal_lm="Mistral4ForCausalLM"),
    # the Qwen3-VL text trunk: sections [4, 1, 1] put pairs 4 and 5 of 8 on the fourth axis (a low
    # RoPE base makes their rotation count)
    "qwen3vl": Spec("Qwen3VLConfig", _common(intermediate_size=96, num_hidden_layers=3, rope_parameters=dict(
        rope_type="default", rope_theta=10.0, mrope_section=[4, 1, 1], mrope_interleaved=True)),
        multimodal="Qwen3VLForConditionalGeneration", reference=unrotate_fourth_axis),
    # the Qwen2.5-VL text trunk (Qwen2-VL's converts to the same file): Qwen2's layer (QKV biases) under
    # multi-axis RoPE, sections [2, 3, 3] over the 8 pairs, which text positions make NeoX RoPE; RMSNorms
    # without epsilon, as llama.cpp computes them
    "qwen2vl": Spec("Qwen2_5_VLConfig", _common(intermediate_size=96, num_hidden_layers=3, rope_parameters=dict(
        rope_type="default", rope_theta=10000.0, mrope_section=[2, 3, 3])),
        multimodal="Qwen2_5_VLForConditionalGeneration", vision=TINY_QWEN2_5_VISION, reference=rms_eps_unread),
    "qwen3vlmoe": Spec("Qwen3VLMoeConfig", _common(
        intermediate_size=96, num_hidden_layers=3, decoder_sparse_step=1, mlp_only_layers=[], num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=32, rope_parameters=dict(
            rope_type="default", rope_theta=10.0, mrope_section=[4, 1, 1], mrope_interleaved=True)),
        multimodal="Qwen3VLMoeForConditionalGeneration", reference=unrotate_fourth_axis,
        checkpoint=hub_expert_layout),
    # gpt-oss: a window of 32 on layers 0 and 2 (the tests score 150 positions), YaRN x4 computed as
    # llama.cpp does, with the correction dims floored and ceiled (transformers' gpt-oss default
    # is truncate=False)
    "gpt-oss": Spec("GptOssConfig", _common(
        intermediate_size=32, num_hidden_layers=4, num_local_experts=4, num_experts_per_tok=2, sliding_window=32,
        layer_types=["sliding_attention", "full_attention"] * 2, attention_bias=True,
        rope_parameters=dict(YARN, beta_fast=32.0, beta_slow=1.0, truncate=True)), prepare=wide_expert_gates),
    # MiniMax-M2: QK-norm over all heads, half of each head rotated, sigmoid routing with a bias
    "minimax-m2": Spec("MiniMaxM2Config", _common(
        intermediate_size=32, num_hidden_layers=3, num_local_experts=4, num_experts_per_tok=2,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5)),
        raw_config={"rotary_dim": 8, "scoring_func": "sigmoid"}, checkpoint=minimax_hub_layout),
    # Llama 4: layer 3 without RoPE, QK L2-norm, experts on layers 1 and 3 (top-1, sigmoid) with a
    # shared expert; 8192-token chunks and the temperature (past 8191) as llama.cpp fixes them
    "llama4": Spec("Llama4TextConfig", _common(
        num_hidden_layers=4, intermediate_size=32, intermediate_size_mlp=96, num_local_experts=4,
        num_experts_per_tok=1, interleave_moe_layer_step=2, no_rope_layers=[1, 1, 1, 0], use_qk_norm=True,
        attention_chunk_size=8192, attn_temperature_tuning=True, floor_scale=8192, attn_scale=0.1,
        layer_types=["chunked_attention"] * 3 + ["full_attention"],
        rope_parameters=dict(rope_type="default", rope_theta=10000.0))),
    # ERNIE 4.5 MoE: past one dense layer, experts on every second layer (1 and 3 of 0-4), softmax
    # with a selection bias, two shared experts (the converter writes their width as the dense
    # width / KV heads, which llama.cpp checks: 128 / 2 = 2 x 32)
    "ernie4_5-moe": Spec("Ernie4_5_MoeConfig", _common(
        num_hidden_layers=5, intermediate_size=128, moe_intermediate_size=32, moe_num_experts=4, moe_k=2,
        moe_num_shared_experts=2, moe_layer_start_index=1, moe_layer_end_index=4, moe_layer_interval=2,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0))),
    # rows of whole K-quant blocks in every expert tensor
    "deepseek2_wide": Spec("DeepseekV3Config", _deepseek(q_lora_rank=48, hidden_size=256, moe_intermediate_size=256),
                           raw_config={"scoring_func": "sigmoid"}),
    # Qwen2: biases on Q, K and V, RoPE on pairs half the head apart
    "qwen2": Spec("Qwen2Config", _common(intermediate_size=96, num_hidden_layers=3)),
    "qwen3": Spec("Qwen3Config", _common(intermediate_size=96, num_hidden_layers=3)),
    "qwen3moe": Spec("Qwen3MoeConfig", _common(intermediate_size=96, num_hidden_layers=3, decoder_sparse_step=1,
                                                mlp_only_layers=[], **MOE)),
    # multiples of 256 in every expert row, for K-quant blocks
    "qwen3moe_wide": Spec("Qwen3MoeConfig", dict(_common(intermediate_size=256, num_hidden_layers=2,
                                                         decoder_sparse_step=1, mlp_only_layers=[], **MOE),
                                                 hidden_size=256, moe_intermediate_size=256, head_dim=64)),
    # scaled RoPE: trained at 128 positions, extended four times (the tests score 150)
    "qwen3_yarn": Spec("Qwen3Config", _common(intermediate_size=96, num_hidden_layers=3, rope_parameters=YARN)),
    "llama_yarn": Spec("LlamaConfig", _common(intermediate_size=96, num_hidden_layers=3, rope_parameters=YARN)),
    "llama_linear": Spec("LlamaConfig", _common(intermediate_size=96, num_hidden_layers=3, rope_parameters=dict(
        rope_type="linear", factor=4.0, rope_theta=10000.0))),
    "mixtral": Spec("MixtralConfig", _common(intermediate_size=32, num_hidden_layers=3, num_local_experts=4,
                                             num_experts_per_tok=2)),
    "qwen3next": Spec("Qwen3NextConfig", _qwen_linear(intermediate_size=96, shared_expert_intermediate_size=32,
                                                      decoder_sparse_step=1, mlp_only_layers=[], **MOE),
                      convert_args=("--no-mtp",)),
    # the same model (same config and seed), converted with Q/K/V and the experts' gate/up fused
    "qwen3next_fused": Spec("Qwen3NextConfig", _qwen_linear(intermediate_size=96, shared_expert_intermediate_size=32,
                                                            decoder_sparse_step=1, mlp_only_layers=[], **MOE),
                            convert_args=("--no-mtp", "--fuse-qkv", "--fuse-gate-up-exps")),
    "qwen35": Spec("Qwen3_5TextConfig", _qwen_linear(intermediate_size=96), convert_args=("--no-mtp",),
                   raw_config={"architectures": ["Qwen3_5ForCausalLM"]}),
    "qwen35moe": Spec("Qwen3_5MoeTextConfig", _qwen_linear(shared_expert_intermediate_size=32, num_experts=4,
                                                           num_experts_per_tok=2, moe_intermediate_size=32),
                      convert_args=("--no-mtp",), raw_config={"architectures": ["Qwen3_5MoeForCausalLM"]}),
    # the converter reads any num_experts_per_tok as MoE, and transformers' AutoConfig fills one
    # in: for a dense model the converter gets config.json raw (AutoConfig fails on the
    # model_type, it falls back on the file) with the pattern string it knows
    "nemotron_h": Spec("NemotronHConfig", _common(
        num_hidden_layers=5, layers_block_type=["mamba", "mlp", "attention", "mamba", "mlp"],
        intermediate_size=96, mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=16, n_groups=2,
        conv_kernel=4, time_step_min=1e-12, layer_norm_epsilon=1e-5),
        raw_config={"hybrid_override_pattern": "M-*M-", "num_hidden_layers": 5, "model_type": "nemotron_h_dense"},
        drop_keys=("layers_block_type", "num_experts_per_tok", "n_routed_experts", "n_shared_experts",
                   "moe_intermediate_size", "moe_shared_expert_intermediate_size", "moe_latent_size")),
    "nemotron_h_moe": Spec("NemotronHConfig", _common(
        num_hidden_layers=5, layers_block_type=["mamba", "moe", "attention", "mamba", "moe"],
        intermediate_size=96, mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=16, n_groups=2,
        conv_kernel=4, time_step_min=1e-12, layer_norm_epsilon=1e-5, n_routed_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, moe_shared_expert_intermediate_size=32, n_group=1, topk_group=1,
        norm_topk_prob=True, routed_scaling_factor=1.5)),
    # Qwen2-MoE: softmax top-2 of 4 experts, weights not renormalised, beside a shared expert
    # under a sigmoid gate; QKV biases
    "qwen2moe": Spec("Qwen2MoeConfig", _common(intermediate_size=96, num_hidden_layers=3, num_experts=4,
                                               num_experts_per_tok=2, moe_intermediate_size=32,
                                               shared_expert_intermediate_size=48, decoder_sparse_step=1,
                                               mlp_only_layers=[], norm_topk_prob=False, qkv_bias=True)),
    # GLM-4: pre- and post-norms, QKV bias, half of each head rotated, gate and up in one tensor
    "glm4": Spec("Glm4Config", _common(intermediate_size=96, num_hidden_layers=3, attention_bias=True,
                                       rope_parameters=dict(rope_theta=10000.0, partial_rotary_factor=0.5,
                                                            rope_type="default")),
                 special_tokens=("[gMASK]", "<|user|>", "<|observation|>")),
    # EXAONE 4.0: norms after the blocks, per-head QK-norm; below 64 layers llama.cpp slides nowhere
    "exaone4": Spec("Exaone4Config", _common(intermediate_size=96, num_hidden_layers=3, sliding_window=None,
                                             layer_types=["full_attention"] * 3)),
    # the 32B's shape (64 layers): a window of 32 on three layers of four, global layers without RoPE
    "exaone4_32b": Spec("Exaone4Config", _common(intermediate_size=32, num_hidden_layers=64, sliding_window=32,
                                                 sliding_window_pattern=4)),
    # SmolLM3: layer 3 of 4 without RoPE (a low RoPE base, so that rotating it or not shows)
    "smollm3": Spec("SmolLM3Config", _common(intermediate_size=96, num_hidden_layers=4, no_rope_layer_interval=4,
                                             rope_parameters=dict(rope_type="default", rope_theta=1000.0))),
    # OLMo 2: norms after attention and the FFN only, QK-norm over all heads; QKV bias off as published
    "olmo2": Spec("Olmo2Config", _common(intermediate_size=96, num_hidden_layers=3)),
    # Olmo 3: a window of 32 on three layers of four (the tests score 150 positions), YaRN on the
    # global layer only; one RoPE base for both kinds, as llama.cpp's graph reads one
    "olmo3": Spec("Olmo3Config", _common(intermediate_size=96, num_hidden_layers=4, sliding_window=32,
                                         layer_types=["sliding_attention"] * 3 + ["full_attention"],
                                         rope_parameters={"full_attention": dict(YARN), "sliding_attention": dict(
                                             rope_type="default", rope_theta=YARN["rope_theta"])})),
    # Gemma 2: a window of 32 on layers 0 and 2, attention logits capped at 5 and final ones at 10 (low,
    # so that the caps show on a tiny model); queries scaled by 1/sqrt(head size), as llama.cpp does
    # below the 27B
    "gemma2": Spec("Gemma2Config", _common(intermediate_size=96, num_hidden_layers=4, sliding_window=32,
                                           query_pre_attn_scalar=16, attn_logit_softcapping=5.0,
                                           final_logit_softcapping=10.0) | dict(tie_word_embeddings=True)),
    # Gemma 3: a window of 32 on five layers of six (the period llama.cpp fixes for the family) at the
    # local RoPE base, a global layer, QK-norm, norms on both sides of each block, the embedding
    # scaled by sqrt(hidden)
    "gemma3": Spec("Gemma3TextConfig", _common(intermediate_size=96, num_hidden_layers=6, sliding_window=32,
                                               query_pre_attn_scalar=16, layer_types=["sliding_attention"] * 5
                                               + ["full_attention"], rope_parameters={
                                                   "full_attention": dict(rope_type="default", rope_theta=1000.0),
                                                   "sliding_attention": dict(rope_type="default", rope_theta=10000.0)})
                   | dict(tie_word_embeddings=True), causal_lm="Gemma3ForCausalLM"),
    # Granite 3: IBM's four multipliers, far from 1 so that each shows
    "granite": Spec("GraniteConfig", _common(intermediate_size=96, num_hidden_layers=3, embedding_multiplier=3.0,
                                             residual_multiplier=0.5, attention_multiplier=0.1, logits_scaling=0.8)),
    # Granite MoE-Shared: the multipliers, softmax top-2 of 4 experts beside a shared expert
    "granitemoe": Spec("GraniteMoeSharedConfig", _common(
        intermediate_size=32, num_hidden_layers=3, num_local_experts=4, num_experts_per_tok=2,
        shared_intermediate_size=48, embedding_multiplier=3.0, residual_multiplier=0.5, attention_multiplier=0.1,
        logits_scaling=0.8)),
    # Phi-4-mini's shape: Q/K/V and gate/up fused, three quarters of each head rotated, tied output
    "phi3": Spec("Phi3Config", _common(intermediate_size=96, num_hidden_layers=3, partial_rotary_factor=0.75,
                                       sliding_window=None) | dict(tie_word_embeddings=True),
                 special_tokens=PHI3_TOKENS),
    # Phi-3-mini-128k's LongRoPE: trained at 64 positions (the tests score 150: the long factors)
    "phi3_longrope": Spec("Phi3Config", _common(
        intermediate_size=96, num_hidden_layers=3, sliding_window=None, original_max_position_embeddings=64,
        rope_parameters=dict(rope_type="longrope", rope_theta=10000.0, original_max_position_embeddings=64,
                             long_factor=[1.0, 1.5, 2.0, 4.0, 8.0, 16.0, 24.0, 32.0],
                             short_factor=[1.0, 1.0, 1.1, 1.2, 1.3, 1.5, 1.8, 2.0])),
        special_tokens=PHI3_TOKENS),
    # Command R: parallel blocks over one LayerNorm, logit scale
    "command-r": Spec("CohereConfig", _common(intermediate_size=96, num_hidden_layers=3, logit_scale=1.5)
                      | dict(tie_word_embeddings=True)),
    # Command R+'s per-head LayerNorm QK-norm, which llama.cpp reads at 64 layers only
    "command-r-plus": Spec("CohereConfig", _common(intermediate_size=32, num_hidden_layers=64, use_qk_norm=True,
                                                   logit_scale=1.5) | dict(tie_word_embeddings=True)),
    # Command R7B: a window of 32 on three layers of four, RoPE on those only
    "cohere2": Spec("Cohere2Config", _common(intermediate_size=96, num_hidden_layers=4, sliding_window=32,
                                             logit_scale=1.5) | dict(tie_word_embeddings=True),
                    raw_config={"rotary_pct": 1.0}),
    # MiMo-V2-Flash (mimo2): a dense global layer, then three sliding ones with sinks and twice the KV
    # heads, keys 16 wide and values 8, half of each head rotated, the attention output scaled;
    # sigmoid top-2 of 4 experts with a selection bias. The converter reads the published config's
    # keys (a model_type AutoConfig does not know makes it read config.json as written)
    "mimo2": Spec("MiMoV2FlashConfig", _common(
        intermediate_size=96, num_hidden_layers=4, moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
        routed_scaling_factor=1.0, norm_topk_prob=True, v_head_dim=8, sliding_window=32, attention_value_scale=0.707,
        rope_parameters={"full_attention": dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5),
                         "sliding_attention": dict(rope_type="default", rope_theta=100.0, partial_rotary_factor=0.5)}),
        convert_args=("--no-mtp",), drop_keys=("rope_parameters",), raw_config=dict(
            hybrid_layer_pattern=[0, 1, 1, 1], swa_num_key_value_heads=4, swa_head_dim=16, swa_num_attention_heads=4,
            swa_v_head_dim=8, topk_method="noaux_tc", layernorm_epsilon=1e-5, partial_rotary_factor=0.5,
            rope_theta=10000.0, swa_rope_theta=100.0, model_type="mimo_v2")),
    # Ling 2.0 (bailingmoe2): a dense layer, then three of sigmoid top-2 of 8 experts in 4 groups of 2
    # (2 used) with a selection bias, weights normed and scaled, beside a shared expert; QK-norm, half
    # of each head rotated (NeoX); one multi-token-prediction layer after the trunk
    "bailingmoe2": Spec("", _common(
        architectures=["BailingMoeV2ForCausalLM"], model_type="bailing_moe_v2", intermediate_size=96,
        num_hidden_layers=4, first_k_dense_replace=1, num_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2,
        moe_intermediate_size=32, num_shared_experts=1, moe_shared_expert_intermediate_size=32,
        routed_scaling_factor=2.5, norm_topk_prob=True, score_function="sigmoid", use_qk_norm=True,
        use_qkv_bias=False, use_bias=False, partial_rotary_factor=0.5, rope_theta=10000.0, rms_norm_eps=1e-6,
        hidden_act="silu", num_nextn_predict_layers=1), writer=bailing_moe_v2),
    # Nemotron-51B, Super and Ultra (deci): grouped heads in twos, a linear map in attention's place, a
    # layer of neither attention nor FFN (Ultra's), one without attention before a wider FFN (51B's),
    # one KV head for four; Llama-3 RoPE factors from an original context of 64 (so that they show). The
    # RoPE as transformers 5 writes it, in rope_parameters: with rope_scaling beside rope_theta, its
    # tokenizer loader (which the converter calls) fails on a config of a model type it does not know
    "deci": Spec("", _common(
        architectures=["DeciLMForCausalLM"], model_type="nemotron-nas", num_hidden_layers=5, rms_norm_eps=1e-5,
        hidden_act="silu", rope_parameters=dict(
            rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
            original_max_position_embeddings=64),
        block_configs=[deci_block(2, ffn_mult=1.5), deci_block(linear=True, ffn_mult=1.5), deci_block(),
                       deci_block(ffn_mult=6.1), deci_block(4, ffn_mult=1.5)]), writer=deci_lm),
    # Grok-1 (grok): its published layout (keyfan/grok-1-hf), the head tied to the embedding; top-2 of 4
    # GELU-gated experts on every layer; its multipliers at values of the tiny width (the embedding's
    # sqrt(hidden) / 2, Q.K's 0.2) and a low attention cap, so that each shows
    "grok": Spec("", _common(
        architectures=["GrokForCausalLM"], model_type="grok-1-hub", intermediate_size=32, num_hidden_layers=4,
        num_local_experts=4, num_experts_per_tok=2, rms_norm_eps=1e-5, rope_theta=10000.0,
        attn_output_multiplier=0.2, attn_logit_softcapping=4.0, embedding_multiplier_scale=4.0,
        output_multiplier_scale=1.0) | dict(tie_word_embeddings=True), writer=grok_checkpoint),
    # Grok-2 (grok): its published layout (xai-org/grok-2) with its own head, a dense GELU MLP beside top-2
    # of 4 experts (residual_moe), rope_type "original" (which the converter writes as YaRN: x8 of an
    # original 256 at base 1000, betas 8 and 1, so that each moves the ramp), the final logit cap, the
    # router cap and query temperature length that llama.cpp reads and does not apply; low caps, so
    # that they show
    "grok2": Spec("", _common(
        architectures=["Grok1ForCausalLM"], model_type="grok-2-hub", intermediate_size=96, moe_intermediate_size=32,
        residual_moe=True, num_hidden_layers=4, num_local_experts=4, num_experts_per_tok=2, rms_norm_eps=1e-5,
        rope_theta=1000.0, rope_type="original", scaling_factor=8.0, original_max_position_embeddings=256,
        extrapolation_factor=1.0, attn_factor=1.0, beta_fast=8, beta_slow=1, attn_logit_softcapping=4.0,
        router_logit_softcapping=30.0, final_logit_softcapping=8.0, attn_temperature_len=1024,
        embedding_multiplier_scale=4.0, output_multiplier_scale=1.5), writer=grok_checkpoint),
    # Ling 3.0 (bailingmoe3): Kimi Delta Attention on layers 0 and 2 (the safe gate, its lower bound -3
    # as the file says), MLA on 1, 3 and 4 (RoPE on consecutive pairs at a low base, a sigmoid gate per
    # head; the converter makes every layer past the last whole group of layer_group_size full
    # attention, transformers' layer_types say so explicitly); a dense layer, then sigmoid top-2 of 8
    # experts in 4 groups of 2 (2 used) with a selection bias, weights normed and scaled, beside a
    # shared expert; SwiGLU limits on two layers' experts and shared experts (none on the dense layer:
    # transformers clamps no dense MLP, llama.cpp would); one multi-token-prediction layer after the
    # trunk, as published. transformers saves head_dim as the RoPE width and its own key names: the
    # converter reads config.json as published (an unknown model_type), with the hub's keys
    "bailingmoe3": Spec("BailingHybridConfig", _common(
        intermediate_size=96, num_hidden_layers=5, moe_intermediate_size=32, n_shared_experts=1,
        num_local_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2, routed_scaling_factor=2.5,
        norm_topk_prob=True, first_k_dense_replace=1, kv_lora_rank=32, q_lora_rank=None, qk_rope_head_dim=8,
        qk_nope_head_dim=16, v_head_dim=16, rope_theta=1000.0, short_conv_kernel_size=4, layer_group_size=2,
        kda_safe_gate=True, kda_lower_bound=-3.0, num_mtp_layers=1,
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention", "full_attention"],
        swiglu_limits=[0.0, 0.0, 1.5, 0.0, 1.0], swiglu_limits_shared=[0.0, 1.2, 0.0, 0.0, 0.8])
        | dict(num_key_value_heads=4),
        raw_config=dict(architectures=["BailingMoeV3ForCausalLM"], model_type="bailing_moe_v3_hub", head_dim=16,
                        n_group=4, num_experts_per_tok=2, norm_topk_prob=True, score_function="sigmoid",
                        moe_shared_expert_intermediate_size=32, no_kda_lora=True,
                        gated_attention_proj_granularity_type="head_wise"),
        checkpoint=ling_mtp_layer),
    # dots.llm1 (dots1): Qwen3's attention (per-head QK-norm, RoPE half the head apart), as many KV heads as
    # heads (llama.cpp's loader sizes K and V by head_count); a dense layer, then three of sigmoid top-2 of 8
    # experts in 4 groups of 2 (2 used) with a selection bias, weights normed and scaled, beside two shared
    # experts (one MLP twice the expert width); transformers' Dots1 always routes by sigmoid and leaves
    # scoring_func out of config.json, without which llama.cpp's graph aborts
    "dots1": Spec("Dots1Config", _common(
        intermediate_size=96, num_hidden_layers=4, moe_intermediate_size=32, n_routed_experts=8,
        num_experts_per_tok=2, n_shared_experts=2, n_group=4, topk_group=2, routed_scaling_factor=2.5,
        norm_topk_prob=True, first_k_dense_replace=1, sliding_window=None,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0)) | dict(num_key_value_heads=4),
        raw_config={"scoring_func": "sigmoid"}),
    # dots3 (dots3note): latent attention on every layer; two sliding layers (a window of 32, RoPE base
    # 100) with their own heads (8), latent rank (24) and head sizes (nope 12 + rope 8, values 8) between
    # full ones (4 heads, rank 32, nope 16 + rope 8, values 16) with DeepSeek Sparse Attention (a 4-head
    # indexer of 64 -- ggml's Hadamard rotation takes multiples of 64 --, the top 16 keys: the tests score
    # 150 positions); the shared RoPE key RMS-normed, a sigmoid gate per head; a dense layer, then sigmoid
    # top-2 of 8 experts with a selection bias, weights normed and scaled, beside a shared expert; the
    # converter looks up its end-of-turn token
    "dots3note": Spec("Dots3NoteTextConfig", _common(
        intermediate_size=96, num_hidden_layers=4, moe_intermediate_size=32, shared_experts_intermediate_size=32,
        n_shared_experts=1, n_routed_experts=8, num_experts_per_tok=2, n_group=1, topk_group=1,
        routed_scaling_factor=2.5, norm_topk_prob=True, q_lora_rank=48, kv_lora_rank=32, qk_rope_head_dim=8,
        qk_nope_head_dim=16, v_head_dim=16, index_topk=16, index_head_dim=64, index_n_heads=4,
        layer_types=["indexed_attention", "sliding_attention", "sliding_attention", "indexed_attention"],
        mlp_layer_types=["dense", "sparse", "sparse", "sparse"], sliding_window=32, rope_theta=10000.0,
        swa_rope_theta=100.0, swa_num_attention_heads=8, swa_num_key_value_heads=8, swa_q_lora_rank=48,
        swa_kv_lora_rank=24, swa_head_dim=20, swa_qk_nope_head_dim=12, swa_qk_rope_head_dim=8, swa_v_head_dim=8)
        | dict(num_key_value_heads=4, head_dim=24), special_tokens=("<|endofassistant|>",),
        causal_lm="Dots3NoteForCausalLM", checkpoint=dots3_hub_config, reference=llama_cpp_dots3_indexer),
    # K-EXAONE (exaone-moe): llama's pre-norm layer with per-head QK-norm; a window of 32 on three layers of
    # four, rotated (NeoX; a low RoPE base, so that it shows), the fourth global without RoPE; a dense layer,
    # then sigmoid top-2 of 8 experts in 4 groups of 2 (2 used) with a selection bias, weights normed and
    # scaled by 4 (unscaled, the NLL on the tests' ids lies within 0.002 of 2.5's), beside a shared MLP of
    # three experts' width; transformers' ExaoneMoe always routes by sigmoid and leaves scoring_func out of
    # config.json, without which llama.cpp's loader stops; one multi-token-prediction block after the
    # trunk, unread
    "exaone-moe": Spec("ExaoneMoeConfig", _common(
        intermediate_size=96, num_hidden_layers=4, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
        num_shared_experts=3, n_group=4, topk_group=2, routed_scaling_factor=4.0, norm_topk_prob=True,
        first_k_dense_replace=1, sliding_window=32, sliding_window_pattern=4,
        rope_parameters=dict(rope_type="default", rope_theta=1000.0)),
        raw_config={"scoring_func": "sigmoid", "num_nextn_predict_layers": 1}, checkpoint=exaone_moe_with_mtp),
    # Muse Glimmer (muse-glimmer): Gemma 3's norms on both sides of each block (the post-norms at eps 1e-8),
    # the embedding RMS-normed, a weightless QK-norm with the queries scaled, a sigmoid gate per value; a
    # window of 32 on layers 1 and 2 with RoPE (a low base, so that it shows), layers 0 and 3 global
    # without it (the converter writes the pattern as a list); logits scaled by 2, then capped at 10;
    # the converter looks up its end-of-turn token
    "muse-glimmer": Spec("MuseGlimmerConfig", _common(
        intermediate_size=96, num_hidden_layers=4, sliding_window=32,
        layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
        layer_rope_theta=[0, 1000.0, 1000.0, 0], rope_parameters=dict(rope_type="default", rope_theta=1000.0),
        output_multiplier=2.0, final_logit_softcapping=10.0), special_tokens=("<|eot|>",),
        multimodal="MuseGlimmerForConditionalGeneration", vision=TINY_MUSE_VISION,
        outer=dict(out_hidden_size=128, projector_hidden_size=32)),
    # Trinity (afmoe): a dense layer, then sigmoid top-2 of 4 experts with a selection bias, weights
    # normed and scaled, beside a shared expert; a window of 32 on three layers of four, the fourth
    # global without RoPE (a low RoPE base, so that it shows); the embedding scaled (muP)
    "afmoe": Spec("AfmoeConfig", _common(
        intermediate_size=96, num_hidden_layers=5, num_dense_layers=1, moe_intermediate_size=32, num_experts=4,
        num_experts_per_tok=2, num_shared_experts=1, route_scale=2.0, global_attn_every_n_layers=4, sliding_window=32,
        mup_enabled=True, rope_parameters=dict(rope_type="default", rope_theta=1000.0)) | dict(route_norm=True)),
    # North (cohere2moe): a dense full-attention layer with RoPE, then sigmoid top-2 of 4 experts beside a
    # shared expert, averaged, on three sliding layers and a global one
    "cohere2moe": Spec("Cohere2MoeConfig", _common(
        intermediate_size=32, num_hidden_layers=5, first_k_dense_replace=1, sliding_window=32, sliding_window_pattern=4,
        num_experts=4, num_experts_per_tok=2, num_shared_experts=1, expert_selection_fn="sigmoid", norm_topk_prob=True,
        logit_scale=1.5, prefix_dense_intermediate_size=96) | dict(tie_word_embeddings=True)),
    # LFM2: short convolutions on layers 0, 1 and 3, attention with QK-norm on layer 2
    "lfm2": Spec("Lfm2Config", _common(intermediate_size=96, num_hidden_layers=4, conv_L_cache=3,
                                       layer_types=["conv", "conv", "full_attention", "conv"],
                                       block_auto_adjust_ff_dim=False) | dict(tie_word_embeddings=True)),
    # LFM2-MoE: one dense block, then sigmoid-routed top-2 of 4 experts with a selection bias
    "lfm2moe": Spec("Lfm2MoeConfig", _common(intermediate_size=96, num_hidden_layers=4, conv_L_cache=3,
                                             layer_types=["conv", "conv", "full_attention", "conv"],
                                             num_dense_layers=1, num_experts=4, num_experts_per_tok=2,
                                             moe_intermediate_size=32, use_expert_bias=True, norm_topk_prob=True)
                    | dict(tie_word_embeddings=True)),
    # Granite 4.0-H: Mamba2 on layers 0, 1 and 3 (4 heads in 2 groups), attention without RoPE on
    # layer 2, softmax top-2 of 4 experts beside a shared expert, the multipliers
    "granitehybrid": Spec("GraniteMoeHybridConfig", _common(
        intermediate_size=32, num_hidden_layers=4, layer_types=["mamba", "mamba", "attention", "mamba"],
        mamba_n_heads=8, mamba_n_groups=2, mamba_d_state=16, mamba_d_head=16, mamba_d_conv=4, mamba_expand=2,
        num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=48, position_embedding_type="nope",
        embedding_multiplier=3.0, residual_multiplier=0.5, attention_multiplier=0.1, logits_scaling=0.8),
        # the layer names of the published config.json, which the converter reads (transformers renames them)
        raw_config={"layer_types": ["mamba", "mamba", "attention", "mamba"]}),
    # Falcon-H1: attention and Mamba2 (4 heads of 16 in 2 groups, no grouped norm) side by side; every
    # multiplier away from 1, so that the converter's folding of them shows
    "falcon-h1": Spec("FalconH1Config", _common(
        intermediate_size=96, num_hidden_layers=3, mamba_d_ssm=64, mamba_n_heads=4, mamba_d_head=16,
        mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4, mamba_rms_norm=False, embedding_multiplier=2.0,
        lm_head_multiplier=1.0, mlp_multipliers=[0.8, 1.2], key_multiplier=0.7, attention_in_multiplier=1.3,
        attention_out_multiplier=0.9, ssm_multipliers=[1.1, 0.9, 1.2, 0.8, 1.05], ssm_in_multiplier=1.1,
        ssm_out_multiplier=0.8)),
    # OLMoE: QK-norm over all heads, softmax top-2 of 4 experts not renormalised; as many KV heads as
    # heads (llama.cpp's loader takes no other K-norm)
    "olmoe": Spec("OlmoeConfig", _common(intermediate_size=32, num_hidden_layers=3, num_experts=4,
                                         num_experts_per_tok=2, norm_topk_prob=False) | dict(num_key_value_heads=4)),
    # Seed-OSS: QKV biases, no output bias (as published), the FFN's pre-norm named post-attention
    "seed_oss": Spec("SeedOssConfig", _common(intermediate_size=96, num_hidden_layers=3, attention_bias=True,
                                              attention_out_bias=False)),
    # DeepSeek-V3.2: deepseek2's, its attention over the top 16 keys of a 4-head indexer of 64 (ggml's
    # Hadamard rotation takes multiples of 64; the tests score 150 positions: sparse past the 16th;
    # a few queries tie at the 16th, where llama.cpp's heap selection decides); YaRN's mscale and
    # mscale_all_dim 1 as published (llama.cpp reads mscale as 1 for this family)
    "deepseek32": Spec("DeepseekV32Config", _deepseek(
        q_lora_rank=48, index_topk=16, index_head_dim=64, index_n_heads=4, num_nextn_predict_layers=0,
        rope_parameters=dict(YARN, mscale=1.0, mscale_all_dim=1.0)),
        raw_config={"scoring_func": "sigmoid"}, reference=llama_cpp_ties),
    # GLM-5.2: deepseek32's, the indexer on consecutive pairs, layers 1, 3 and 4 sharing the selection
    # of the full layer before them; GLM's special tokens for its converter
    "glm-dsa": Spec("GlmMoeDsaConfig", {k: v for k, v in _deepseek(
        q_lora_rank=48, index_topk=16, index_head_dim=64, index_n_heads=4, num_nextn_predict_layers=0,
        num_hidden_layers=5, indexer_types=["full", "shared", "full", "shared", "shared"],
        rope_parameters=dict(rope_type="default", rope_theta=10000.0)).items()
        if k not in ("rope_interleave", "n_group", "topk_group")},
        special_tokens=("[gMASK]", "<|user|>", "<|observation|>"), reference=llama_cpp_ties),
    # Kimi-Linear: KDA on layers 0, 1 and 3 (4 heads of 16, convolutions of 4), latent attention
    # without RoPE on layer 2 (no query rank), a dense layer, then sigmoid top-2 of 4 experts with a
    # selection bias, renormalised and scaled, beside a shared expert; the checkpoint's own config
    # keys, which the converter reads
    "kimi-linear": Spec("KimiLinearConfig", {k: v for k, v in _common(
        intermediate_size=96, num_hidden_layers=4, moe_intermediate_size=32, n_shared_experts=1,
        num_local_experts=4, num_experts_per_tok=2, routed_scaling_factor=2.5, norm_topk_prob=True, kv_lora_rank=32,
        qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, q_lora_rank=None, linear_head_dim=16,
        linear_num_heads=4, linear_conv_kernel_dim=4, mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
        layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"]).items()
        if k != "head_dim"} | dict(num_key_value_heads=4),
        raw_config=dict(first_k_dense_replace=1, moe_router_activation_func="sigmoid", linear_attn_config=dict(
            full_attn_layers=[3], kda_layers=[1, 2, 4], head_dim=16, num_heads=4, short_conv_kernel_size=4)),
        checkpoint=kimi_hub_layout),
    # Kimi-K3: KDA on layers 0 and 2 (4 heads of 16, the safe gate's lower bound -5), gated latent
    # attention without RoPE on 1 and 3; attention residuals over blocks of 2 layers (the embedding
    # and layer 2's input banked); a dense layer, then sigmoid top-2 of 4 experts in a latent space of
    # 32 with a selection bias, renormalised and scaled, beside two shared experts (one MLP twice as wide,
    # as the release's); SiTU everywhere, its betas low enough to show
    "kimi-k3": Spec("", {k: v for k, v in _common(
        intermediate_size=96, num_hidden_layers=4, moe_intermediate_size=32, num_shared_experts=2, num_experts=4,
        num_experts_per_token=2, routed_scaling_factor=2.5, moe_renormalize=True, moe_router_activation_func="sigmoid",
        first_k_dense_replace=1, routed_expert_hidden_size=32, kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=8,
        qk_nope_head_dim=16, v_head_dim=16, mla_use_nope=True, hidden_act="situ", activation_situ_beta=1.5,
        activation_situ_linear_beta=2.0, attn_res_block_size=2, rms_norm_eps=1e-6,
        linear_attn_config=dict(full_attn_layers=[2, 4], kda_layers=[1, 3], head_dim=16, num_heads=4,
                                short_conv_kernel_size=4, gate_lower_bound=-5.0)).items()
        if k != "head_dim"} | dict(num_key_value_heads=4), writer=kimi_k3),
    # GLM-5.3-Flash: four streams of hyper-connections mixed by Sinkhorn; KDA on layers 0 and 3 (4 heads
    # of 16, the safe gate's lower bound -5), latent attention without RoPE on 1 and 2, the k-pool
    # indexer of layer 1 (pools of 4, the top 16 keys: the tests score 150 positions; 16 heads, so that a
    # pool's score seldom ties at 0, where transformers' topk and ggml's heap keep different pools)
    # shared by layer 2; a dense layer, then sigmoid top-2 of 4 experts with a selection bias beside a
    # shared expert, every SwiGLU clamped at 1.5
    "glm5next": Spec("Glm5NextConfig", {k: v for k, v in _common(
        intermediate_size=96, num_hidden_layers=4, moe_intermediate_size=32, n_shared_experts=1, n_routed_experts=4,
        num_experts_per_tok=2, routed_scaling_factor=2.5, norm_topk_prob=True, kv_lora_rank=32, q_lora_rank=48,
        qk_rope_head_dim=0, qk_nope_head_dim=16, v_head_dim=16, index_topk=16, index_head_dim=16, index_n_heads=16,
        index_kpool=4, swiglu_limit=1.5, linear_head_dim=16, linear_num_heads=4, linear_conv_kernel_dim=4,
        linear_lower_bound=-5.0, hc_mult=4, hc_eps=1e-6, hc_sinkhorn_iters=20, rms_norm_eps=1e-6,
        mlp_layer_types=["dense", "sparse", "sparse", "sparse"], indexer_types=["full", "full", "shared", "full"],
        layer_types=GLM5NEXT_LAYERS).items() if k != "head_dim"} | dict(num_key_value_heads=4),
        multimodal="Glm5NextForConditionalGeneration", vision=TINY_GLM5NEXT_VISION,
        prepare=glm5next_params,
        special_tokens=("[gMASK]", "<|user|>", "<|observation|>"),
        raw_config=dict(first_k_dense_replace=1, mla_use_nope=True, linear_attn_config=dict(
            head_dim=16, num_heads=4, short_conv_kernel_size=4, gate_lower_bound=-5.0))),
    # Step-3.5 (Step-3.7-Flash's text trunk): a dense global layer, then two sliding ones with twice the
    # heads, all their width rotated at their own base, and a global one rotating half; a sigmoid gate
    # per head; sigmoid top-2 of 4 experts with a selection bias beside a shared expert; SwiGLU limits on
    # the last layer's experts and shared expert
    "step35": Spec("Step3p7Config", _common(
        intermediate_size=96, num_hidden_layers=4, moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
        share_expert_dim=48, sliding_window=32, num_sliding_attention_heads=8, moe_router_scaling_factor=2.0,
        layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
        mlp_layer_types=["dense", "sparse", "sparse", "sparse"], swiglu_limits=[0.0, 0.0, 0.0, 1.5],
        swiglu_limits_shared=[0.0, 0.0, 0.0, 1.2], rope_theta=[1000.0, 100.0, 100.0, 1000.0],
        partial_rotary_factors=[0.5, 1.0, 1.0, 0.5]),
        multimodal="Step3p7ForConditionalGeneration", vision=TINY_STEP_VISION, checkpoint=step35_hub_config),
    # Qwen4-Exp (Qwen3.8-Flash-Next): four streams of hyper-connections (rank 8), Gated DeltaNet with a
    # sigmoid output gate on layers 0 and 2, query-sparse attention on 1 and 3 (2 indexer heads, blocks
    # of 4, a budget of 8: the tests score 150 positions), the n-gram hash embedding on layer 0 (bigrams
    # and trigrams, 2 heads each, prime tables of about 100 rows), top-2 of 4 experts beside a gated
    # shared expert
    "qwen4exp": Spec("Qwen4ExpTextConfig", _qwen_linear(
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
        hc_count=4, hc_lowrank=8, ple_layer_ids=[1], ngram_size=3, heads_per_ngram=2, ngram_vocab_size_base=100,
        make_ngram_vocab_size_divisible_by=8, split_ngram_parts=2, ple_conv_kernel_size=3, indexer_n_heads=2,
        indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=8, indexer_compress_ratio=4,
        output_gate_type="sigmoid", rope_parameters=dict(
            rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5, mrope_section=[2, 1, 1],
            mrope_interleaved=True)) | dict(layer_types=QWEN4EXP_LAYERS), causal_lm="Qwen4ExpForCausalLM",
        prepare=sharper_head, reference=llama_cpp_qsa,
        # a model_type unknown to AutoConfig: the converter reads config.json as it is
        raw_config={"architectures": ["Qwen4ExpForCausalLM"], "layer_types": QWEN4EXP_LAYERS,
                    "model_type": "qwen4_exp_hub"}),
    # MiniMax-M3: a dense layer, then two of MiniMax Sparse Attention (blocks of 16, the top 3 for each
    # KV group's indexer head, the query's own block first: the tests score 150 positions) over
    # sigmoid top-2 of 4 experts beside a shared expert, gpt-oss's clamped SwiGLU everywhere
    "minimax-m3": Spec("MiniMaxM3VLTextConfig", _common(
        intermediate_size=32, num_hidden_layers=3, num_local_experts=4, num_experts_per_tok=2,
        dense_intermediate_size=96, shared_intermediate_size=32, rotary_dim=8, index_n_heads=2, index_head_dim=16,
        index_block_size=16, index_topk_blocks=3, index_local_blocks=1, mlp_layer_types=["dense", "sparse", "sparse"],
        layer_types=["full_attention", "minimax_m3_sparse", "minimax_m3_sparse"],
        rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5)),
        causal_lm="MiniMaxM3VLForCausalLM", checkpoint=functools.partial(minimax_hub_layout, version=3),
        raw_config=dict(architectures=["MiniMaxM3SparseForCausalLM"], model_type="minimax_m3_hub",
                        scoring_func="sigmoid", n_shared_experts=1, moe_layer_freq=[0, 1, 1],
                        sparse_attention_config=dict(
                            sparse_num_index_heads=2, sparse_index_dim=16, sparse_topk_blocks=3, sparse_block_size=16,
                            sparse_local_block=1))),
    # Gemma 4 E2B's shape: per-layer embeddings (8 a layer), a window of 8 on every other layer (its
    # normed queries and keys attend broadly: a wider window hardly shows), global layers with their
    # own head size (32), the last two layers sharing the K/V of layers 2 and 3
    "gemma4": Spec("Gemma4TextConfig", _common(
        intermediate_size=96, num_hidden_layers=6, sliding_window=8, global_head_dim=32,
        layer_types=["sliding_attention", "full_attention"] * 3, num_kv_shared_layers=2,
        hidden_size_per_layer_input=8, vocab_size_per_layer_input=VOCAB, final_logit_softcapping=10.0,
        rope_parameters=GEMMA4_ROPE) | dict(tie_word_embeddings=True), prepare=gemma4_scalars),
    # Gemma 4 26B-A4B's: top-2 of 4 experts beside the MLP, global layers with one KV head of 32
    # whose V is K's projection
    "gemma4_moe": Spec("Gemma4TextConfig", _common(
        intermediate_size=96, num_hidden_layers=4, sliding_window=32, global_head_dim=32,
        layer_types=["sliding_attention", "full_attention"] * 2, hidden_size_per_layer_input=0,
        enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32, attention_k_eq_v=True,
        num_global_key_value_heads=1, final_logit_softcapping=10.0, rope_parameters=GEMMA4_ROPE)
        | dict(tie_word_embeddings=True), prepare=gemma4_scalars),
    # Apertus: per-head QK-norm before NeoX RoPE with Llama-3's frequency factors (trained at 64 positions,
    # the tests score 150), an ungated MLP under xIELU whose parameters differ per layer
    "apertus": Spec("ApertusConfig", _common(intermediate_size=96, num_hidden_layers=3, rope_parameters=dict(
        rope_type="llama3", rope_theta=10000.0, factor=8.0, original_max_position_embeddings=64, low_freq_factor=1.0,
        high_freq_factor=4.0)), prepare=xielu_per_layer),
    # MiniMax-Text-01: seven lightning-attention layers, then one of softmax attention (llama.cpp's
    # interval of 8, which the converter leaves it to), every block's normed input scaled by DeepNorm's
    # (2 x layers)^(1/4) as the residual (the published 3.5566 at 80 layers); top-2 of 4 softmax-routed
    # experts renormalised
    "minimax-01": Spec("MiniMaxConfig", _common(
        intermediate_size=32, num_hidden_layers=8, num_local_experts=4, num_experts_per_tok=2,
        layer_types=["linear_attention"] * 7 + ["full_attention"], full_attn_alpha_factor=2.0,
        linear_attn_alpha_factor=2.0, mlp_alpha_factor=2.0,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
        checkpoint=minimax01_hub_layout,
        raw_config=dict(architectures=["MiniMaxText01ForCausalLM"], rotary_dim=16,
                        layernorm_full_attention_alpha=2.0, layernorm_linear_attention_alpha=2.0,
                        layernorm_mlp_alpha=2.0, layernorm_full_attention_beta=1.0,
                        layernorm_linear_attention_beta=1.0, layernorm_mlp_beta=1.0)),
    # Hunyuan-A13B: per-head QK-norm after RoPE (NeoX), top-2 of 4 softmax-routed experts renormalised,
    # beside an ungated shared MLP of the same width on every layer; the converter reads its per-layer
    # lists (transformers' config holds one value)
    "hunyuan-moe": Spec("HunYuanMoEV1Config", _common(
        intermediate_size=32, num_hidden_layers=4, num_experts=4, moe_topk=2,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
        checkpoint=hunyuan_hub_layout),
    # Hy3: per-head QK-norm before RoPE (NeoX), one dense layer, then sigmoid top-2 of 4 experts chosen
    # with a selection bias, renormalised and scaled by 2.5, beside an ungated shared expert twice the
    # experts' width; a multi-token-prediction block after the trunk, unread
    "hy_v3": Spec("HYV3Config", _common(
        intermediate_size=96, num_hidden_layers=4, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, num_shared_experts=2, router_scaling_factor=2.5,
        mlp_layer_types=["dense"] + ["sparse"] * 3,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
        raw_config=dict(num_nextn_predict_layers=1), checkpoint=hy3_with_mtp),
    # Hy4: MLA (4 heads, nope 16 + rope 8 on consecutive pairs, values 16, ranks 48 / 32) with learned
    # sinks and a sigmoid gate per value; DSA: 4 indexer heads of 48 (more than the 32 rotated at hidden
    # 2048), the rotated part last, the top 16 keys (the tests score 150 positions), layers 1 and 3
    # sharing the selection of 0 and 2, ties at the 16th as llama.cpp's heap selection breaks them; four
    # iHC streams (magnitude 2); one dense layer, then sigmoid top-2 of 4 experts with a selection bias,
    # renormalised and scaled, their SwiGLU clamped at 1.5, beside an unclamped shared expert; RMS eps
    # 1e-6, the eps transformers norms the Q and KV latents with (llama.cpp: the file's RMS eps)
    "hy_v4": Spec("HYV4Config", {k: v for k, v in _common(
        intermediate_size=96, num_hidden_layers=4, moe_intermediate_size=32, n_routed_experts=4,
        num_experts_per_tok=2, n_shared_experts=1, routed_scaling_factor=2.5, q_lora_rank=48, kv_lora_rank=32,
        qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, index_topk=16, index_head_dim=48,
        index_n_heads=4, indexer_types=["full", "shared", "full", "shared"],
        mlp_layer_types=["dense"] + ["sparse"] * 3, hc_mult=4, hc_magnitude=2.0, hc_eps=1e-6, swiglu_limit=1.5,
        rms_norm_eps=1e-6,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0)).items() if k != "head_dim"},
        prepare=hy4_params, checkpoint=hy4_hub_layout, reference=llama_cpp_ties),
    # Laguna-XS.2: a global layer of 4 heads (YaRN x4 on half of each head), then three sliding ones (a
    # window of 32: the tests score 150 positions) of 8 heads rotating all of it at their own base;
    # QK-norm, a softplus gate per head; a dense layer, then sigmoid top-2 of 4 experts with a selection
    # bias, renormalised and scaled, beside a shared expert of its own width; experts per expert, as
    # the published checkpoints hold them
    "laguna": Spec("LagunaConfig", _common(
        intermediate_size=96, num_hidden_layers=4, num_attention_heads_per_layer=[4, 8, 8, 8], num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
        moe_routed_scaling_factor=2.5, sliding_window=32, gating=True,
        layer_types=["full_attention"] + ["sliding_attention"] * 3, mlp_layer_types=["dense"] + ["sparse"] * 3,
        rope_parameters={"full_attention": dict(YARN, partial_rotary_factor=0.5), "sliding_attention": dict(
            rope_type="default", rope_theta=100.0, partial_rotary_factor=1.0)}),
        checkpoint=per_expert_layout),
    # Laguna-M.1: every layer global (no window), a softplus gate per value; two dense layers, then experts
    "laguna_m1": Spec("LagunaConfig", _common(
        intermediate_size=96, num_hidden_layers=3, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, sliding_window=0, gating="per-element",
        layer_types=["full_attention"] * 3, mlp_layer_types=["dense", "dense", "sparse"],
        rope_parameters={"full_attention": dict(rope_type="default", rope_theta=1000.0, partial_rotary_factor=0.5)}),
        checkpoint=per_expert_layout),
    # Mamba-1: four layers of the selective scan (inner width 128, state 16, dt rank 4), nothing else
    "mamba": Spec("MambaConfig", _common(num_hidden_layers=4, state_size=16, conv_kernel=4)),
    # Falcon-Mamba: Mamba-1 with dt, B and C RMS-normed without weights (ssm.dt_b_c_rms), at the layers'
    # eps (llama.cpp norms them with it; the published model's mixer eps is 1e-6, its layers' 1e-5)
    "falcon_mamba": Spec("FalconMambaConfig", _common(num_hidden_layers=2, state_size=16, conv_kernel=4,
                                                      layer_norm_epsilon=1e-6, mixer_rms_eps=1e-6)),
    # Jamba: Mamba-1 with dt, B and C normed by weights of their own on layers 0, 1 and 3, attention
    # without RoPE on layer 2, softmax top-2 of 4 experts (not renormalised) on layers 1 and 3
    "jamba": Spec("JambaConfig", _common(
        num_hidden_layers=4, intermediate_size=96, attn_layer_period=4, attn_layer_offset=2, expert_layer_period=2,
        expert_layer_offset=1, num_experts=4, num_experts_per_tok=2, mamba_d_state=16, mamba_d_conv=4,
        mamba_expand=2)),
}

# a member at real width (tests/test_activation_memory.py): hidden 2048 (the tiny ones' 64 x 32) in
# heads of a real model's size (attention's 64, MLA's 64 + 32, the recurrent mixers' 64 and 128, as
# many more of them as make up the width), state and latent ranks as DeepSeek's and Mamba2's,
# feed-forward blocks 16 times as wide
WIDE = "@2048"
WIDER = {**dict.fromkeys(("hidden_size", "q_lora_rank", "swa_q_lora_rank", "mamba_d_ssm", "routed_expert_hidden_size"),
                          32),
         **dict.fromkeys(("kv_lora_rank", "swa_kv_lora_rank"), 16),
         **dict.fromkeys(("num_attention_heads", "num_attention_heads_per_layer", "num_key_value_heads",
                          "num_sliding_attention_heads", "swa_num_attention_heads", "swa_num_key_value_heads",
                          "mamba_num_heads", "mamba_n_heads", "linear_key_head_dim", "linear_value_head_dim",
                          "ssm_state_size", "mamba_d_state"), 8),
         **dict.fromkeys(("head_dim", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "swa_head_dim",
                          "swa_v_head_dim", "swa_qk_nope_head_dim", "swa_qk_rope_head_dim", "global_head_dim",
                          "mamba_head_dim", "mamba_d_head", "linear_num_key_heads", "linear_num_value_heads"), 4),
         **dict.fromkeys(("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size",
                          "moe_shared_expert_intermediate_size", "share_expert_dim", "shared_intermediate_size",
                          "shared_experts_intermediate_size", "prefix_dense_intermediate_size"), 16)}


def wide(spec: Spec) -> Spec:
    def wider(config: dict) -> dict:
        def times(v, n: int):   # a count, or one per layer
            return v * n if isinstance(v, int) else [x * n for x in v] if isinstance(v, list) else v
        return {k: times(v, WIDER[k]) if k in WIDER else v for k, v in config.items()}
    return replace(spec, kwargs=wider(spec.kwargs), raw_config=wider(spec.raw_config))


SPECS |= {name + WIDE: wide(spec) for name, spec in list(SPECS.items())}
# ERNIE's converter writes the shared experts' width as intermediate_size // num_key_value_heads
SPECS["ernie4_5-moe" + WIDE].kwargs["num_key_value_heads"] = 2
# transformers' multi-axis RoPE takes sections that cover the head's 32 pairs
SPECS["qwen2vl" + WIDE].kwargs["rope_parameters"] = dict(SPECS["qwen2vl"].kwargs["rope_parameters"],
                                                         mrope_section=[8, 12, 12])
# Jamba's Mamba-1 state is 16 wide at every size (Mamba2's 128 is WIDER's)
SPECS["jamba" + WIDE].kwargs["mamba_d_state"] = 16
# GLM-5.3-Flash's KDA heads are its attention heads (its converter asserts it), as wide as its latent ones
SPECS["glm5next" + WIDE].kwargs.update(linear_num_heads=32, linear_head_dim=64)
SPECS["glm5next" + WIDE].raw_config["linear_attn_config"] = dict(
    SPECS["glm5next"].raw_config["linear_attn_config"], num_heads=32, head_dim=64)


def build_hf(name: str, out: Path, seed: int = 0):
    """Save a random model `name` (and the tiny tokenizer) under `out`; return the model (None: a
    checkpoint its `writer` wrote, of a family transformers lacks)."""
    import transformers
    from transformers import AutoModelForCausalLM

    spec = SPECS[name]
    torch.manual_seed(seed)
    if spec.writer is not None:
        spec.writer(spec.kwargs, out)
        write_tokenizer(out, spec.special_tokens)
        return None
    if spec.multimodal:
        config = getattr(transformers, spec.config)(text_config=spec.kwargs, vision_config=spec.vision,
                                                    tie_word_embeddings=False, **spec.outer)
        model = getattr(transformers, spec.multimodal)._from_config(config, dtype=torch.float32).eval()
    else:
        config = getattr(transformers, spec.config)(**spec.kwargs)
        if spec.causal_lm:
            model = getattr(transformers, spec.causal_lm)._from_config(config, dtype=torch.float32,
                                                                        experts_implementation="eager").eval()
        else:
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, experts_implementation="eager").eval()
    with torch.no_grad():  # random norm weights and biases too (routers' selection biases are buffers)
        for pname, p in [*model.named_parameters(), *model.named_buffers()]:
            if p.is_floating_point() and (("norm" in pname and p.dim() == 1) or "bias" in pname):
                p.add_(torch.randn_like(p) * INIT)
        if spec.prepare is not None:
            spec.prepare(model)
    model.save_pretrained(out)
    if spec.checkpoint is not None:
        spec.checkpoint(out)
    if spec.reference is not None:
        spec.reference(model)
    write_tokenizer(out, spec.special_tokens)
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    for key in spec.drop_keys:
        cfg.pop(key, None)
    cfg.update(spec.raw_config)
    cfg_path.write_text(json.dumps(cfg, indent=1))
    return model


@functools.cache
def converter() -> subprocess.Popen:
    """The session's converting process, started on the first conversion."""
    llama = str(llama_cpp_source(LLAMA_CPP_PYTHON))
    return subprocess.Popen([sys.executable, "-c", CONVERTER.format(llama=llama)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def convert(hf_dir: Path, out: Path, outtype: str = "f32", extra: tuple = ()) -> Path:
    process = converter()
    process.stdin.write(json.dumps([str(hf_dir), "--outfile", str(out), "--outtype", outtype, *extra]) + "\n")
    process.stdin.flush()
    answer = process.stdout.readline()
    if not answer:
        raise RuntimeError(f"convert_hf_to_gguf.py's process ended (exit {process.wait()})")
    if (answer := json.loads(answer)) != "ok":
        raise RuntimeError(f"convert_hf_to_gguf.py failed:\n{answer[-3000:]}")
    return out


def tiny_model(name: str, root: Path, scratch: Path, outtype: str = "f32"):
    """(the Hugging Face model, the path of its GGUF) under `root`, which other processes (a test
    session's workers) may share: the first one there builds and converts the model; another builds
    it again (the same seed: the same weights) under its own `scratch` folder and reads the GGUF."""
    hf_dir, gguf = root / f"{name}-hf", root / f"{name}-{outtype}.gguf"
    with filling(hf_dir):
        first = not (hf_dir / "config.json").exists()
        model = build_hf(name, hf_dir if first else scratch / f"{name}-hf")
        if not gguf.exists():
            convert(hf_dir, gguf, outtype, SPECS[name].convert_args)
    return model, gguf


@contextlib.contextmanager
def wide_models(names: list[str], root: Path):
    """{name: path} of the members named at real width (WIDE), converted to float16, for the block:
    written in memory where /dev/shm has room for them (each some hundred MB, its Hugging Face
    folder twice that while it converts), else under `root`; removed after."""
    import shutil

    shm = Path("/dev/shm")
    scratch = shm if shm.is_dir() and shutil.disk_usage(shm).free > 4 * 2 ** 30 else root
    folder = scratch / f"layercycle-{os.getpid()}-wide"
    folder.mkdir()
    try:
        paths = {}
        for name in names:
            hf_dir = folder / f"{name}{WIDE}-hf"
            build_hf(name + WIDE, hf_dir)
            paths[name] = convert(hf_dir, folder / f"{name}{WIDE}-f16.gguf", "f16", SPECS[name].convert_args)
            shutil.rmtree(hf_dir)
        yield paths
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def synthetic_member(m, folder: Path, tokenizer_from: Path) -> Path:
    """A member of the conformance matrix that pipeline/tools/synthetic.py writes, as FOLDER/NAME.gguf,
    with the tokenizer of `tokenizer_from` (the converted member its tokenizer_from names)."""
    from pipeline.tools.synthetic import Shape, write_synthetic_gguf

    shape = {k: v for k, v in m.synthetic.items() if k != "tokenizer_from"}
    return write_synthetic_gguf(folder / f"{m.name}.gguf", Shape(**shape), tokenizer_from)


def member_in_8_bits(m, folder: Path, tiny=None) -> Path:
    """A member of the conformance matrix with its matrices in 8 bits, under `folder`: converted with
    `--outtype q8_0`, or (a synthetic member) written with Q4_0 matrices, whose products take Q8_0
    activations alike. `tiny(name, outtype)` gives a converted member (the tests' shared fixture);
    by default it is built under `folder`."""
    import dataclasses

    tiny = tiny or (lambda name, outtype: tiny_model(name, folder, folder / "scratch", outtype))
    if not m.synthetic:
        return tiny(m.name, "q8_0")[1]
    quantized = dataclasses.replace(m, name=f"{m.name}-q4_0", synthetic={**m.synthetic, "quant": "Q4_0"})
    return synthetic_member(quantized, folder, tiny(m.synthetic["tokenizer_from"], "f32")[1])


def write_members(folder: Path) -> None:
    """Every member of the conformance matrix as FOLDER/NAME.gguf, as `python -m pipeline.gpu_check`
    reads them on a machine without the converter: the converted ones, then the synthetic ones."""
    import tempfile

    from pipeline.tools.architectures import MATRIX

    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for m in sorted(MATRIX, key=lambda m: bool(m.synthetic)):
            if m.synthetic:
                synthetic_member(m, folder, folder / f"{m.synthetic['tokenizer_from']}.gguf")
            else:
                build_hf(m.name, Path(tmp) / m.name)
                convert(Path(tmp) / m.name, folder / f"{m.name}.gguf", "f32", SPECS[m.name].convert_args)
            print(folder / f"{m.name}.gguf")


if __name__ == "__main__":
    write_members(Path(sys.argv[1]))
