"""LM head + log-softmax NLL over the scored positions, and the llama-perplexity statistics.

Log-probabilities are computed in float32 (as llama.cpp does) and summed in float64.
"""
import math

import numpy as np
import torch

LOGITS_BUDGET = 1 << 26  # float32 logits materialised at once (256 MiB)


@torch.inference_mode()
def window_nll(head, hidden: torch.Tensor, ids: np.ndarray, lo: int, hi: int, device, dtype) -> np.ndarray:
    """hidden [T, hidden] of one corpus window -> NLL of targets ids[lo:hi], float64 [hi - lo]."""
    vocab = head.weight.shape[0]
    rows_per_slice = max(1, LOGITS_BUDGET // vocab)
    targets = torch.from_numpy(np.asarray(ids[lo:hi], dtype=np.int64)).to(device)
    out = []
    for a in range(lo - 1, hi - 1, rows_per_slice):
        b = min(a + rows_per_slice, hi - 1)
        logits = head(hidden[a:b].to(device, dtype)).float()  # [rows, vocab]
        logp = torch.log_softmax(logits, dim=-1)
        out.append(-logp.gather(1, targets[a - lo + 1:b - lo + 1, None])[:, 0])
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
