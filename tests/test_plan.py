"""The sequence plan: llama-perplexity's method and the sliding-stride recipe."""
import numpy as np
import pytest

from pipeline.errors import UserError
from pipeline.run.corpus_plan import Method, plan_sequences


def test_llama_cpp_windows_bos_and_scored_half():
    tokens = np.arange(100, 100 + 1050)
    plan = plan_sequences(tokens, Method("llama-cpp", ctx=256, bos=True), bos_id=1)
    assert plan.n_sequences == 4 == plan.available            # floor(1050 / 256), the tail dropped
    assert (plan.ids[:, 0] == 1).all()                       # first token of every chunk -> BOS
    np.testing.assert_array_equal(plan.ids[2, 1:], tokens[2 * 256 + 1:3 * 256])
    assert (plan.score_lo == 129).all() and (plan.score_hi == 256).all()
    assert plan.tokens_scored == 4 * (256 // 2 - 1)          # ctx/2 - 1 per chunk


def test_llama_cpp_without_bos_keeps_tokens_and_chunks_limit():
    tokens = np.arange(1000)
    plan = plan_sequences(tokens, Method("llama-cpp", ctx=100, chunks=3), bos_id=None)
    assert plan.n_sequences == 3 and plan.available == 10
    np.testing.assert_array_equal(plan.ids.ravel(), tokens[:300])


def test_llama_cpp_needs_two_windows():
    with pytest.raises(UserError, match="at least 2 \\* ctx"):
        plan_sequences(np.arange(300), Method("llama-cpp", ctx=256), bos_id=None)


@pytest.mark.parametrize("total,ctx,stride", [(1000, 128, 64), (1000, 128, 128), (777, 100, 30)])
def test_stride_scores_every_token_once(total, ctx, stride):
    tokens = np.arange(total)
    plan = plan_sequences(tokens, Method("stride", ctx=ctx, stride=stride), bos_id=None)
    scored = np.concatenate([plan.ids[w, plan.score_lo[w]:plan.score_hi[w]] for w in range(plan.n_sequences)])
    np.testing.assert_array_equal(scored, tokens[1:])        # each token once, in order
    assert plan.score_lo[0] == 1
    assert (plan.score_lo[1:] >= ctx - stride).all()         # at least ctx - stride tokens of context


def test_method_options_are_checked():
    with pytest.raises(UserError):
        Method("perplexity")
    with pytest.raises(UserError):
        Method("llama-cpp", stride=10)
    with pytest.raises(UserError):
        Method("stride", unscored_prefix=3)
