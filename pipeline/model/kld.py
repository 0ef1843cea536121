"""KL-divergence of a model against a base model, token by token (its summary:
run/modes/figures.py).

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


@torch.inference_mode()
def token_stats(heads: list, rows: list[torch.Tensor], targets: torch.Tensor) -> torch.Tensor:
    """The model's and the base's heads and hidden rows [R, hidden], targets [R] ->
    [R, len(figures.FIELDS)] float64, one vocabulary slice at a time, with z and y the two models' logits:
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


# what llama.cpp's base file keeps of a distribution: log-probabilities within 16 nats of the top
# one, in 65,536 steps; the KL sum takes base log-probabilities above -16 only
FILE_RANGE = 16.0
FILE_LEVELS = 65535.0


@torch.inference_mode()
def quantized_log_probs(head, rows: torch.Tensor, row_width: int) -> np.ndarray:
    """hidden rows [R, hidden] -> [R, row_width] uint16: each row's log-softmax as llama.cpp's
    base file holds it (scale, minimum log-probability, then a code per vocabulary entry). The
    R x vocab logits exist at once: callers pass rows in blocks of LOGITS_BUDGET / vocab."""
    z = torch.cat([s for _, s in head.logit_slices(rows, scoring.VOCAB_SLICE)], -1)    # [R, V] float32
    top = z.max(-1).values
    low = torch.maximum(z.min(-1).values, top - FILE_RANGE)
    lse = torch.log(torch.exp((z - top[:, None]).double()).sum(-1)).float()           # float64 sum, as llama.cpp
    scale = (top - low) / FILE_LEVELS
    inv = torch.where(scale > 0, 1 / scale, torch.zeros_like(scale))
    codes = torch.where(z > low[:, None], torch.round(inv[:, None] * (z - low[:, None])), 0)  # half to even
    out = np.zeros((rows.shape[0], row_width), dtype=np.uint16)
    out[:, :4] = torch.stack([scale, low - top - lse], -1).cpu().numpy().view(np.uint16)
    out[:, 4:4 + z.shape[1]] = codes.to(torch.int32).cpu().numpy()
    return out


@torch.inference_mode()
def file_token_stats(head, rows: torch.Tensor, targets: torch.Tensor, base: np.ndarray) -> torch.Tensor:
    """The model's head and hidden rows [R, hidden], targets [R], and the base's rows of a llama.cpp
    file [R, row_width] uint16 -> [R, len(figures.FIELDS)] float64 as llama-perplexity --kl-divergence
    computes them: KL = sum over entries whose base log-probability b is above -16 of
    exp(b) (b - log q), the base's NLL and top token read from its codes."""
    device = targets.device
    scale, low = (torch.from_numpy(np.ascontiguousarray(base[:, :4]).view(np.float32).copy()).to(device).T)
    codes = base[:, 4:]
    model = scoring.StreamingSoftmax(targets, torch.float32)
    cross = torch.zeros(targets.shape[0], dtype=torch.float64, device=device)   # sum p_b (b - z)
    mass = torch.zeros_like(cross)                                              # sum p_b
    base_top = torch.full_like(scale, -math.inf)
    base_arg = torch.zeros(targets.shape[0], dtype=torch.long, device=device)
    for start, z in head.logit_slices(rows, scoring.VOCAB_SLICE):               # z [R, S] float32
        model.add(start, z)
        c = torch.from_numpy(codes[:, start:start + z.shape[1]].astype(np.float32)).to(device)
        b = scale[:, None] * c + low[:, None]                                   # [R, S] base log-probs
        top, where = b.max(-1)
        base_arg = torch.where(top > base_top, where + start, base_arg)         # the first maximum
        base_top = torch.maximum(base_top, top)
        p = torch.where(b > -FILE_RANGE, torch.exp(b), 0).double()
        cross += (p * (b.double() - z.double())).sum(-1)
        mass += p.sum(-1)
    kld = cross + model.lse().double() * mass
    lq = model.logprob().double()
    picked = torch.from_numpy(codes[np.arange(len(codes)), targets.cpu().numpy()].astype(np.float32)).to(device)
    lb = (scale * picked + low).double()
    same = (model.argmax == base_arg).double()
    return torch.stack([-lq, -lb, kld, same, lq.exp() - lb.exp()], -1)
