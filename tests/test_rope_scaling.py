"""Scaled RoPE is computed as llama.cpp defines it, or refused: tiny models with YaRN and
linear scaling, converted by llama.cpp's converter, against the Hugging Face models they came
from (whose YaRN and llama.cpp's agree: ramp between floored/ceiled correction dims, attention
scaled by 1 + 0.1 ln factor); a file whose scaling is removed scores differently; settings that
llama.cpp does not read for the family, and scaling types it does not compute, are refused."""
import pytest
import torch
import torch.nn.functional as F
from gguf import Keys

from pipeline.errors import UserError
from pipeline.gguf_io.reader import GGUFIndex
from pipeline.model.arch import load_architecture

from .helpers import forward, random_ids
from .tiny_gguf import rewrite_gguf

# float32 on both sides over the same weights; measured max |diff| on logits up to 9.4: 1.5e-5
# (qwen3 YaRN), 1.0e-4 (llama YaRN), 6.3e-5 (llama linear). Leaving out YaRN's ramp or its
# attention factor fails this; removing the scaling moves the NLL (next test).
ATOL = 2e-4


def key(path, template: str) -> str:
    return template.format(arch=GGUFIndex(path).architecture)


def nll(logits: torch.Tensor, ids: torch.Tensor) -> float:
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten()).item()


@pytest.mark.parametrize("name,kind", [("qwen3_yarn", "yarn"), ("llama_yarn", "yarn"), ("llama_linear", "linear")])
def test_scaled_rope_matches_transformers(name, kind, tiny_model):
    model, path = tiny_model(name)
    index = GGUFIndex(path)
    assert index.arch_value(Keys.Rope.SCALING_TYPE) == kind and index.arch_value(Keys.Rope.SCALING_FACTOR) == 4.0
    ids = random_ids()
    with torch.no_grad():
        ref = model(ids).logits
    assert (forward(path, ids) - ref).abs().max().item() < ATOL


@pytest.mark.parametrize("name", ["qwen3_yarn", "llama_linear"])
def test_removing_the_scaling_moves_the_nll(name, tiny_model, tmp_path):
    _, path = tiny_model(name)
    plain = rewrite_gguf(path, tmp_path / "plain.gguf", metadata={key(path, Keys.Rope.SCALING_TYPE): "none"})
    ids = random_ids()
    scaled, unscaled = nll(forward(path, ids), ids), nll(forward(plain, ids), ids)
    assert abs(scaled - unscaled) > 0.01   # 50 x what the tolerance above allows the logits


@pytest.mark.parametrize("template,value,message", [
    (Keys.Rope.SCALING_TYPE, "longrope", "'longrope' is not computed"),
    (Keys.Rope.SCALING_YARN_BETA_FAST, 16.0, "yarn_beta_fast = 16"),
    (Keys.Rope.SCALING_YARN_EXT_FACTOR, 0.5, "yarn_ext_factor = 0.5"),
    (Keys.Rope.SCALING_YARN_LOG_MUL, 0.1, "yarn_log_multiplier = 0.1"),
    (Keys.Rope.SCALING_YARN_ATTN_FACTOR, 2.0, "yarn_attn_factor = 2"),
])
def test_rope_settings_llama_cpp_does_not_compute_are_refused(template, value, message, tiny_model, tmp_path):
    _, path = tiny_model("qwen3_yarn")
    odd = rewrite_gguf(path, tmp_path / "odd.gguf", metadata={key(path, template): value})
    with pytest.raises(UserError, match=message):
        load_architecture(GGUFIndex(odd))


def test_the_older_linear_key_is_read(tiny_model, tmp_path):
    # no scaling type and the factor under its older name: llama.cpp scales linearly
    _, path = tiny_model("llama_linear")
    old = rewrite_gguf(path, tmp_path / "old.gguf", metadata={
        key(path, Keys.Rope.SCALING_TYPE): None, key(path, Keys.Rope.SCALING_FACTOR): None,
        key(path, "{arch}.rope.scale_linear"): 4.0})
    ids = random_ids(n_rows=1)
    assert torch.equal(forward(old, ids), forward(path, ids))


def test_longrope_takes_its_long_factors_past_the_context_llama_cpp_rounds_to_256():
    """llama.cpp compares its context per sequence, rounded up to 256, with the original context:
    250 tokens against 255 is 256 > 255, long factors (transformers would take the short ones)."""
    from pipeline.model.arch.rope import RopeSpec, frequency_factors

    short, long = (1.0, 1.0), (2.0, 4.0)
    spec = RopeSpec(4, 10000.0, True, freq_factors=short, long_factors=long, long_after=255)
    assert frequency_factors(spec, 250) == long
    assert frequency_factors(RopeSpec(4, 10000.0, True, freq_factors=short, long_factors=long, long_after=256),
                             250) == short
    assert frequency_factors(RopeSpec(4, 10000.0, True, freq_factors=short), 10 ** 6) == short
