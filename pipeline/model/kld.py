"""KL-divergence of a model against a base model, token by token, and llama-perplexity's
summary of it.

Nothing of the base's vocabulary-sized distribution is stored: the base run keeps its final
boundary (the hidden state before the output norm, `hidden` values per token), and the
compared run recomputes the base's log-probabilities from it with the base's own head, one
vocabulary slice at a time. With float32 boundaries that is the base distribution exactly, at
4 x hidden bytes per token (2.3 KB for SmolLM2, where llama.cpp's base file holds 2 x vocab
= 98 KB, floored to 16 bits).
"""
import math

import numpy as np
import torch

from . import scoring

# per-token quantities, in this order, along the last axis of the Score task's token array
FIELDS = ("nll", "nll_base", "kld", "same_top", "delta_p")


@torch.inference_mode()
def token_stats(heads: list, rows: list[torch.Tensor], targets: torch.Tensor) -> torch.Tensor:
    """The model's and the base's heads and hidden rows [R, hidden], targets [R] ->
    [R, len(FIELDS)] float64, one vocabulary slice at a time, with z and y the two models' logits:
    KL(base || model) = sum_v p_base (y - z) - lse(y) + lse(z). Each model's softmax is the one a
    run of its own computes (so the base's NLL is its own run's, exactly); the KL sum is float64."""
    model, base = (scoring.StreamingSoftmax(targets, torch.float32) for _ in range(2))
    cross = torch.zeros(targets.shape[0], dtype=torch.float64, device=targets.device)
    slices = zip(*(head.logit_slices(x, scoring.VOCAB_SLICE) for head, x in zip(heads, rows)), strict=True)
    for (start, z), (_, y) in slices:                      # [R, S] logits of ids [start, start + S)
        model.add(start, z)
        rescale, weights = base.add(start, y)              # weights: exp(y - running max)
        cross = cross * rescale + (weights.double() * (y.double() - z.double())).sum(-1)
    kld = (cross / base.sum - base.lse().double() + model.lse().double()).clamp_min(0)
    lq, lb = model.logprob().double(), base.logprob().double()
    same = (model.argmax == base.argmax).double()
    return torch.stack([-lq, -lb, kld, same, lq.exp() - lb.exp()], -1)


def summarize(stats: np.ndarray) -> dict:
    """stats [tokens, len(FIELDS)] -> what llama-perplexity's KLD mode reports."""
    s = dict(zip(FIELDS, stats.T))
    kld, dp, n = s["kld"], s["delta_p"], stats.shape[0]
    pct = lambda v, q: float(np.percentile(v, q))  # noqa: E731
    lq, lb = -s["nll"], -s["nll_base"]
    mean_q, mean_b = float(s["nll"].mean()), float(s["nll_base"].mean())
    return {
        "mean": float(kld.mean()), "stderr": float(kld.std(ddof=1) / math.sqrt(n)) if n > 1 else 0.0,
        "median": pct(kld, 50), "min": float(kld.min()), "max": float(kld.max()),
        "p90": pct(kld, 90), "p95": pct(kld, 95), "p99": pct(kld, 99), "p99_9": pct(kld, 99.9),
        "same_top": float(s["same_top"].mean()),
        "delta_p_rms": float(np.sqrt((dp ** 2).mean())), "delta_p_mean": float(dp.mean()),
        "delta_p_median": pct(dp, 50), "delta_p_min": float(dp.min()), "delta_p_max": float(dp.max()),
        "delta_p_p1": pct(dp, 1), "delta_p_p99": pct(dp, 99),
        "ppl": math.exp(mean_q), "ppl_base": math.exp(mean_b), "ppl_ratio": math.exp(mean_q - mean_b),
        "ppl_diff": math.exp(mean_q) - math.exp(mean_b), "ln_ppl_ratio": mean_q - mean_b,
        "logprob_correlation": float(np.corrcoef(lq, lb)[0, 1]) if n > 1 else 1.0,
        "tokens": int(n),
    }
