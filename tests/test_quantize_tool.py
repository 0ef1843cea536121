"""The overnight sweep's models: a bfloat16 synthetic base and what llama-quantize makes of it,
each written once (llama-quantize stood in for by a script that records its arguments)."""
import pytest

from pipeline.errors import UserError
from pipeline.tools import llamacpp
from pipeline.tools.quantize import quantized_set

BASE = dict(family="qwen3moe", layers=2, hidden=256, heads=4, kv_heads=2, head_dim=64, quant="BF16", experts=4,
            experts_used=2, expert_ffn=128, tokenizer_from="smollm2-135m")


def test_the_base_and_each_type_are_made_once(tmp_path, model_path, monkeypatch):
    model_path("smollm2-135m")
    calls = tmp_path / "calls"
    fake = tmp_path / "llama-quantize"
    fake.write_text(f'#!/bin/sh\necho "$3" >> {calls}\ncp "$1" "$2"\n')
    fake.chmod(0o755)
    monkeypatch.setattr(llamacpp, "llama_tool", lambda version, name: fake)
    cfg = {"name": "night", "types": ["Q8_0", "IQ4_XS"], "llama_cpp_python": "0.3.36", "base": BASE}

    made = quantized_set(cfg, tmp_path / "models")
    assert [p.name for p in made] == ["night-BF16.gguf", "night-Q8_0.gguf", "night-IQ4_XS.gguf"]
    assert calls.read_text().split() == ["Q8_0", "IQ4_XS"]
    assert made[1].read_bytes() == made[0].read_bytes()              # what the stand-in was given: the base
    assert not list((tmp_path / "models").glob("*.partial"))
    assert quantized_set(cfg, tmp_path / "models") == made            # nothing made twice
    assert calls.read_text().split() == ["Q8_0", "IQ4_XS"]


def test_a_base_that_is_not_bfloat16_is_refused(tmp_path, model_path):
    model_path("smollm2-135m")
    cfg = {"name": "night", "types": [], "llama_cpp_python": "0.3.36", "base": {**BASE, "quant": "Q4_K"}}
    with pytest.raises(UserError, match="written in BF16"):
        quantized_set(cfg, tmp_path)
