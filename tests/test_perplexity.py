"""Perplexity through the whole windowed pipeline against llama-perplexity's figures
(tests/data/llama-perplexity.md), and cycled == whole, bit for bit, on the CPU."""
import pytest

from .helpers import HEAD40K, run_pipeline

# running estimates after each 512-token chunk of head40k (llama-perplexity, ctx 512)
SMOLLM2_RUNNING = [13.0665, 21.4582, 22.6003, 22.8855, 22.3709, 22.5590, 23.2911, 24.5958]
# llama.cpp quantizes activations to 8 bits in its matrix products; float32 sits 0.5-0.9% away
REL_TOL = 0.015


def test_ppl_matches_llama_perplexity(tmp_path):
    """On SmolLM2 (every family's tiny member is checked against llama-perplexity token by token in
    the conformance matrix, and the bench puts each registered model beside it)."""
    r = run_pipeline(tmp_path, model="smollm2-135m", task="wikitext-2", corpus=str(HEAD40K), ctx=512, chunks=8)
    assert r["chunks"] == 8 and r["tokens_scored"] == 8 * 255
    running = [w["running_ppl"] for w in r["per_window"]]
    assert running == pytest.approx(SMOLLM2_RUNNING, rel=REL_TOL)
    assert r["placement"][0]["first"] == 0 and {w["device"] for w in r["placement"]} == {"cpu"}
    assert {w["expert_slices"] for w in r["placement"]} == {1}
    assert r["model"]["n_layers"] == r["placement"][-1]["last"]


def test_cycled_equals_whole_bit_for_bit(tmp_path):
    """On SmolLM2 (every family's tiny member is cycled against its whole trunk in the conformance
    matrix, tests/test_conformance.py)."""
    common = dict(model="smollm2-135m", task="wikitext-2", corpus=str(HEAD40K), ctx=128, chunks=3,
                  sequences_per_chunk=2)
    whole = run_pipeline(tmp_path, window_layers=0, **common)
    assert len(whole["placement"]) == 1
    for size in (1, 7):  # 7 divides none of 30, 18, 24
        cycled = run_pipeline(tmp_path, window_layers=size, **common)
        assert len(cycled["placement"]) == -(-whole["model"]["n_layers"] // size)
        assert cycled["mean_nll"] == whole["mean_nll"]
        assert [w["mean_nll"] for w in cycled["per_window"]] == [w["mean_nll"] for w in whole["per_window"]]


def test_stride_method_scores_every_token_once(tmp_path):
    corpus = tmp_path / "head6k.txt"   # about 1,400 tokens: 11 sequences, the last one aligned to the end
    corpus.write_text(HEAD40K.read_text(encoding="utf-8")[:6000], encoding="utf-8")
    r = run_pipeline(tmp_path, task="wikitext-2", corpus=str(corpus), method="stride", ctx=256, stride=128,
                     window_layers=0)
    assert r["tokens_scored"] == r["corpus"]["tokens"] - 1
    llama = run_pipeline(tmp_path, task="wikitext-2", corpus=str(corpus), ctx=256, window_layers=0)
    assert r["ppl"] < llama["ppl"] * 1.2  # same text, at least half a window of context per token


def test_bfloat16_boundaries_change_little(tmp_path):
    common = dict(task="wikitext-2", corpus=str(HEAD40K), ctx=128, chunks=4, window_layers=10)
    exact = run_pipeline(tmp_path, **common)
    packed = run_pipeline(tmp_path, boundary_dtype="bfloat16", **common)
    assert packed["boundary_dtype"] == "bfloat16"
    assert packed["mean_nll"] != exact["mean_nll"]                          # it is rounded at each cut
    assert packed["mean_nll"] == pytest.approx(exact["mean_nll"], rel=5e-3)  # and only a little


def test_float16_boundaries_refused_for_gemma3(tmp_path):
    from .helpers import assert_one_line_error, luigi_cli

    done = luigi_cli("--model", "gemma3-270m", "--task", "wikitext-2", "--corpus", str(HEAD40K), "--ctx", "128",
                     "--chunks", "4", "--boundary-dtype", "float16", run_root=tmp_path)
    assert_one_line_error(done, "beyond float16's range")


def test_shards_give_the_numbers_of_one_chain(tmp_path):
    common = dict(ctx=64, chunks=7, sequences_per_chunk=2, window_layers=10)  # 4 Zarr chunks, the last one short
    one = run_pipeline(tmp_path, **common)
    three = run_pipeline(tmp_path, shards=3, **common)
    assert [w["mean_nll"] for w in three["per_window"]] == [w["mean_nll"] for w in one["per_window"]]
    assert (three["mean_nll"], three["tokens_scored"], three["shards"]) == (one["mean_nll"], one["tokens_scored"], 3)
    assert len(list((tmp_path / "Embed").iterdir())) == 1 + 3   # each shard is a chain of its own
