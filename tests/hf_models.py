"""Tiny random Hugging Face models, converted to GGUF by llama.cpp's own convert_hf_to_gguf.py.

The converter (from llama-cpp-python's sdist, cached outside the repository) fixes the GGUF
conventions -- tensor layouts, signs of A, norm offsets, head orders -- so our readers are
checked against the format's owner. The one thing bypassed is its tokenizer fingerprint check:
our 384-token byte-level BPE (Qwen2 pre-tokenizer regex, trained on pydoc topics) is unknown to
it, and is declared "qwen2".

Weights use a larger init scale than the default so that predictions are far from uniform: a
broken layer then moves the logits instead of hiding under ln(vocab).
"""
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from pipeline.tools.llamacpp import llama_cpp_source

LLAMA_CPP_PYTHON = "0.3.36"
VOCAB = 384
INIT = 0.25

CONVERT = """
import runpy, sys
sys.path.insert(0, {llama!r})
import conversion.base
conversion.base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
sys.argv = ["convert_hf_to_gguf.py", *{args!r}]
runpy.run_path({llama!r} + "/convert_hf_to_gguf.py", run_name="__main__")
"""


def write_tokenizer(out: Path) -> None:
    import pydoc_data.topics

    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from pipeline.gguf_io.tokenizer import _QWEN2

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_QWEN2), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    text = "\n".join(list(pydoc_data.topics.topics.values())[:40])
    tok.train_from_iterator([text], trainers.BpeTrainer(
        vocab_size=VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"], show_progress=False))
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(out)


def _common(**kw) -> dict:
    return dict(vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                max_position_embeddings=512, initializer_range=INIT, tie_word_embeddings=False,
                eos_token_id=0, bos_token_id=0, pad_token_id=0, **kw)


def _qwen_linear(**kw) -> dict:
    return _common(linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
                   linear_num_key_heads=2, linear_num_value_heads=4,
                   layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
                   num_hidden_layers=4, **kw)


@dataclass
class Spec:
    config: str                       # transformers config class
    kwargs: dict
    raw_config: dict = field(default_factory=dict)   # keys written into config.json for the converter
    drop_keys: tuple = ()                            # keys removed from config.json for the converter
    convert_args: tuple = ()


YARN = dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=128, rope_theta=10000.0)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True)
SPECS = {
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
}


def build_hf(name: str, out: Path, seed: int = 0):
    """Save a random model `name` (and the tiny tokenizer) under `out`; return the model."""
    import transformers
    from transformers import AutoModelForCausalLM

    spec = SPECS[name]
    config = getattr(transformers, spec.config)(**spec.kwargs)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, experts_implementation="eager").eval()
    with torch.no_grad():  # random norm weights and biases too, so that none of them is a no-op
        for pname, p in model.named_parameters():
            if p.dim() == 1 and ("norm" in pname or "bias" in pname):
                p.add_(torch.randn_like(p) * INIT)
    model.save_pretrained(out)
    write_tokenizer(out)
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    for key in spec.drop_keys:
        cfg.pop(key, None)
    cfg.update(spec.raw_config)
    cfg_path.write_text(json.dumps(cfg, indent=1))
    return model


def convert(hf_dir: Path, out: Path, outtype: str = "f32", extra: tuple = ()) -> Path:
    llama = str(llama_cpp_source(LLAMA_CPP_PYTHON))
    args = [str(hf_dir), "--outfile", str(out), "--outtype", outtype, *extra]
    done = subprocess.run([sys.executable, "-c", CONVERT.format(llama=llama, args=args)],
                          capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"convert_hf_to_gguf.py failed:\n{done.stderr[-3000:]}")
    return out


def tiny_model(name: str, root: Path, outtype: str = "f32"):
    """(the Hugging Face model, the path of its GGUF)."""
    hf_dir = root / f"{name}-hf"
    model = build_hf(name, hf_dir)
    return model, convert(hf_dir, root / f"{name}-{outtype}.gguf", outtype, SPECS[name].convert_args)
