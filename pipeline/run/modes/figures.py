"""The figures a run reports, from its per-token numbers, as llama-perplexity computes them
(numpy only: reducing a run's scores needs no torch)."""
import math

import numpy as np

# per-token quantities of a KL comparison, in this order, along the last axis of the Score task's array
FIELDS = ("nll", "nll_base", "kld", "same_top", "delta_p")


def perplexity_figures(nll_per_sequence: list[np.ndarray]) -> dict:
    """PPL and its error the way llama-perplexity computes them, plus per-sequence figures (the
    result's `per_window` list, named as the --per-window option)."""
    all_nll = np.concatenate(nll_per_sequence)
    n = all_nll.size
    mean = float(all_nll.sum() / n)
    var = float((all_nll ** 2).sum() / n - mean ** 2)
    ppl = math.exp(mean)
    stderr = ppl * math.sqrt(var / (n - 1)) if n > 1 and var > 0 else 0.0
    per_window, total, count = [], 0.0, 0
    for i, w in enumerate(nll_per_sequence):
        total, count = total + float(w.sum()), count + w.size
        per_window.append({"window": i, "tokens": int(w.size), "mean_nll": float(w.mean()),
                           "running_ppl": math.exp(total / count)})
    return {"ppl": ppl, "ppl_stderr": stderr, "mean_nll": mean, "tokens_scored": int(n),
            "per_window": per_window}


def kld_figures(stats: np.ndarray) -> dict:
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
