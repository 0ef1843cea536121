"""DeepSeek-V4 (deepseek4) on small random files that gguf-py writes (pipeline/tools/synthetic.py:
no converter takes a model of this family from transformers without its hub checkpoint's FP4
experts): PPL against llama-perplexity's on the same file, each of its forms moving the NLL, and the settings
llama.cpp does not compute refused (its passes: the conformance matrix, test_conformance.py)."""
import math

import pytest
import torch
import torch.nn.functional as F

from pipeline.errors import UserError
from pipeline.gguf_io.reader import GGUFIndex
from pipeline.model.arch import deepseek4, load_architecture
from pipeline.tools.synthetic import Shape, write_synthetic_gguf

from .helpers import HEAD40K, forward, hidden_after, random_ids, run_pipeline
from .tiny_gguf import rewrite_gguf

# four layers, one of each kind and a second sparse one: a window of 16 keys; compressed entries of 4
# keys, the indexer's top 8 (sparse from the 36th query on); all entries of 128 keys; the first layer
# routed by the token's id; YaRN x4 past 128 positions on the compressed layers; float32 weights, so
# that llama-perplexity computes what we do without rounding the activations
SHAPE = Shape(family="deepseek4", layers=4, hidden=128, heads=4, kv_heads=1, head_dim=64, rope_dim=16, context=512,
              quant="F32", experts=8, experts_used=2, expert_ffn=64, shared_ffn=64, streams=4, sliding_window=16,
              pattern="CHSC", q_lora_rank=64, index_heads=2, index_dim=64, index_top_k=8, out_groups=2, out_rank=32,
              hash_layers=1, swiglu_limit=2.0)
# llama-perplexity (llama-cpp-python 0.3.36) -f wikitext-2-test.head40k.txt -t 2 -fa off -ctk f32 -ctv f32
LLAMA_PPL = {(256, 4): 962918.0978, (512, 4): 1089679.8242}
MOVED = 0.005


@pytest.fixture(scope="module")
def ds4(tmp_path_factory, model_path):
    return write_synthetic_gguf(tmp_path_factory.mktemp("deepseek4") / "ds4.gguf", SHAPE, model_path("smollm2-135m"))


def nll(path, ids, dtype=torch.float32) -> float:
    logits = forward(path, ids, dtype)
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten()).item()


@pytest.mark.parametrize("ctx, chunks, window_layers", [(256, 4, 0), (512, 4, 1)])
def test_ppl_is_llama_perplexitys(ds4, tmp_path, ctx, chunks, window_layers):
    """Within 6e-8 nats (measured: 5.8e-8 and 2.3e-8); a wrong selection, mixing or RoPE moves it
    by more than 1e-3."""
    r = run_pipeline(tmp_path, model=str(ds4), corpus=str(HEAD40K), ctx=ctx, chunks=chunks,
                     window_layers=window_layers)
    assert abs(r["mean_nll"] - math.log(LLAMA_PPL[ctx, chunks])) < 2e-7


def test_a_sequence_shorter_than_an_entry_sees_its_window_only(ds4):
    """Three tokens complete no entry of 4: their logits are those of the same positions in a
    longer sequence, whose later entries they cannot see."""
    ids = random_ids(2, 40)
    assert torch.allclose(forward(ds4, ids[:, :3]), forward(ds4, ids)[:, :3], atol=1e-5)


def test_experts_in_slices_equal_held_ones_on_hash_routed_and_biased_layers(ds4):
    assert torch.equal(hidden_after(ds4, 1), hidden_after(ds4, 4))


FEATURES_OFF = {
    "the indexer's selection": {"deepseek4.attention.indexer.top_k": 1024},
    "Sinkhorn's iterations": {"deepseek4.hyper_connection.sinkhorn_iterations": 1},
    "the sliding window": {"deepseek4.attention.sliding_window": 1024},
    "the SwiGLU clamp": {"deepseek4.swiglu_clamp_exp": [0.0] * 4, "deepseek4.swiglu_clamp_shexp": [0.0] * 4},
    "the compressed layers' RoPE base": {"deepseek4.attention.compress_rope_freq_base": 10000.0},
}


@pytest.mark.parametrize("feature", FEATURES_OFF)
def test_each_form_moves_the_nll(feature, ds4, tmp_path):
    changed = rewrite_gguf(ds4, tmp_path / "changed.gguf", metadata=FEATURES_OFF[feature])
    ids = random_ids(2, 256)
    assert abs(nll(ds4, ids) - nll(changed, ids)) > MOVED


def test_hash_routing_moves_the_nll(ds4, monkeypatch):
    ids = random_ids(2, 256)
    routed = nll(ds4, ids)
    monkeypatch.setattr(deepseek4.HashRoutedMoE, "route", lambda self, flat, ids: deepseek4.MoE.route(self, flat))
    assert abs(routed - nll(ds4, ids)) > MOVED


@pytest.mark.parametrize("metadata, says", [
    ({"deepseek4.expert_gating_func": 1}, "only with sqrt-softplus routing"),
    ({"deepseek4.attention.compress_ratios": [4, 8, 0, 4]}, "compress ratio 8"),
    ({"deepseek4.hyper_connection.count": 1}, "two streams or more"),
])
def test_what_llama_cpp_does_not_compute_is_refused(ds4, tmp_path, metadata, says):
    changed = rewrite_gguf(ds4, tmp_path / "changed.gguf", metadata=metadata)
    load_architecture.cache_clear()
    with pytest.raises(UserError, match=says):
        load_architecture(GGUFIndex(changed))
