"""Every metadata setting that changes the math is computed or refused by name before any work:
a registered model with one setting added that its family does not compute is refused; the
settings a family computes are honoured (Gemma-3's final logit soft-cap, group-limited expert
routing)."""
import pytest
import torch
from gguf import Keys

from pipeline.errors import UserError
from pipeline.gguf_io.reader import GGUFIndex
from pipeline.model.arch import load_architecture

from .tiny_gguf import rewrite_gguf


def with_metadata(src, dst, values: dict):
    arch = GGUFIndex(src).architecture
    return rewrite_gguf(src, dst, metadata={k.format(arch=arch): v for k, v in values.items()})


@pytest.mark.parametrize("template,value", [
    (Keys.LLM.LOGIT_SCALE, 0.5),
    (Keys.LLM.ATTN_LOGIT_SOFTCAPPING, 50.0),
    (Keys.LLM.FINAL_LOGIT_SOFTCAPPING, 30.0),
    (Keys.LLM.EMBEDDING_SCALE, 12.0),
    (Keys.LLM.RESIDUAL_SCALE, 0.2),
    (Keys.Attention.SCALE, 0.5),
    (Keys.Attention.SLIDING_WINDOW, 256),
    (Keys.Attention.CAUSAL, False),
    (Keys.Rope.SCALING_ALPHA, 1000.0),
    (Keys.LLM.EXPERT_GATING_FUNC, 2),
])
def test_a_setting_the_family_does_not_compute_is_refused(template, value, model_path, tmp_path):
    src = model_path("smollm2-135m")
    odd = with_metadata(src, tmp_path / "odd.gguf", {template: value})
    with pytest.raises(UserError, match=template.format(arch="llama").replace(".", r"\.")):
        load_architecture(GGUFIndex(odd))


def test_neutral_values_are_accepted(model_path, tmp_path):
    src = model_path("smollm2-135m")
    plain = with_metadata(src, tmp_path / "plain.gguf", {Keys.LLM.LOGIT_SCALE: 1.0, Keys.Attention.SLIDING_WINDOW: 0,
                                                         Keys.Attention.SCALE: 0.125, Keys.LLM.EXPERT_GATING_FUNC: 1})
    load_architecture(GGUFIndex(plain))


def test_gemma3_final_logit_softcap_is_applied(model_path, tmp_path):
    src = model_path("gemma3-270m")
    capped = with_metadata(src, tmp_path / "capped.gguf", {Keys.LLM.FINAL_LOGIT_SOFTCAPPING: 10.0})
    x = torch.randn(4, 640, generator=torch.Generator().manual_seed(0))
    plain_head = load_architecture(GGUFIndex(src)).load_head("cpu", torch.float32)
    capped_head = load_architecture(GGUFIndex(capped)).load_head("cpu", torch.float32)
    raw = plain_head(x)
    assert raw.abs().max() > 10
    # llama.cpp's gemma3 graph: scale by 1/cap, tanh, scale by cap
    torch.testing.assert_close(capped_head(x), torch.tanh(raw / 10.0) * 10.0)


def test_group_limited_routing_is_read_and_checked(tiny_model, tmp_path):
    _, path = tiny_model("qwen3moe")
    grouped = with_metadata(path, tmp_path / "grouped.gguf",
                            {Keys.LLM.EXPERT_GROUP_COUNT: 2, Keys.LLM.EXPERT_GROUP_USED_COUNT: 1})
    routing = load_architecture(GGUFIndex(grouped)).routing(0)
    assert (routing.n_groups, routing.n_groups_used) == (2, 1)
    bad = with_metadata(path, tmp_path / "bad.gguf",
                        {Keys.LLM.EXPERT_GROUP_COUNT: 3, Keys.LLM.EXPERT_GROUP_USED_COUNT: 1})
    with pytest.raises(UserError, match="4 experts in 3 groups"):
        load_architecture(GGUFIndex(bad))   # before any layer is loaded


def test_an_attention_temperature_on_mistral4_is_refused(tiny_model, tmp_path):
    """Mistral 4's converter writes no temperature and layercycle computes none for the deepseek2
    graph: a file that sets one (as llama.cpp's Mistral Large reading would apply) is refused."""
    _, path = tiny_model("mistral4")
    load_architecture(GGUFIndex(path))
    tempered = with_metadata(path, tmp_path / "tempered.gguf", {Keys.Attention.TEMPERATURE_SCALE: 0.1})
    with pytest.raises(UserError, match=r"mistral4\.attention\.temperature_scale = 0\.1"):
        load_architecture(GGUFIndex(tempered))
