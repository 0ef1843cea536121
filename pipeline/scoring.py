"""LM head + log-softmax NLL over the scored positions, and the llama-perplexity statistics.

Log-probabilities are computed in float32 (as llama.cpp does) and summed in float64.
"""
import math

import numpy as np
import torch

LOGITS_BUDGET = 1 << 26  # float32 logits materialised at once (256 MiB)


@torch.inference_mode()
def window_scores(heads: list, hidden: list[torch.Tensor], ids: np.ndarray, lo: int, hi: int,
                  device, dtype) -> np.ndarray:
    """hidden [T, hidden] of one corpus window (and of the KL base's, with its head) -> the
    figures of targets ids[lo:hi], float64 [hi - lo, fields]: the NLL alone, or kld.FIELDS."""
    from .kld import token_stats

    vocab = max(h.weight.shape[0] for h in heads)
    rows_per_slice = max(1, LOGITS_BUDGET // (vocab * len(heads)))
    targets = torch.from_numpy(np.asarray(ids[lo:hi], dtype=np.int64)).to(device)
    out = []
    for a in range(lo - 1, hi - 1, rows_per_slice):
        b = min(a + rows_per_slice, hi - 1)
        t = targets[a - lo + 1:b - lo + 1]
        logits = [head(h[a:b].to(device, dtype)).float() for head, h in zip(heads, hidden)]  # [rows, vocab]
        if len(heads) == 1:
            out.append(-torch.log_softmax(logits[0], dim=-1).gather(1, t[:, None]))
        else:
            out.append(token_stats(logits[0], logits[1], t))
    return torch.cat(out).double().cpu().numpy()


def summarize(nll_per_window: list[np.ndarray]) -> dict:
    """PPL and its error the way llama-perplexity computes them, plus per-window figures."""
    all_nll = np.concatenate(nll_per_window)
    n = all_nll.size
    mean = float(all_nll.sum() / n)
    var = float((all_nll ** 2).sum() / n - mean ** 2)
    ppl = math.exp(mean)
    stderr = ppl * math.sqrt(var / (n - 1)) if n > 1 and var > 0 else 0.0
    per_window, total, count = [], 0.0, 0
    for i, w in enumerate(nll_per_window):
        total, count = total + float(w.sum()), count + w.size
        per_window.append({"window": i, "tokens": int(w.size), "mean_nll": float(w.mean()),
                           "running_ppl": math.exp(total / count)})
    return {"ppl": ppl, "ppl_stderr": stderr, "mean_nll": mean, "tokens_scored": int(n),
            "per_window": per_window}
