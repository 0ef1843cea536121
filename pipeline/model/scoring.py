"""LM head + log-softmax NLL over the scored positions (the figures from them: run/modes/figures.py).

The head is applied one slice of the vocabulary at a time (a 262k-entry vocabulary never
materialises all its logits): the log-sum-exp, the argmax and the target's logit of each row
are accumulated slice by slice. Logits and log-probabilities are float32 whatever the compute
dtype (as llama.cpp's); NLLs are summed in float64.
"""
import contextlib
import math

import numpy as np
import torch

VOCAB_SLICE = 1 << 14        # vocabulary entries whose logits are computed at once
LOGITS_BUDGET = 1 << 22      # logits per model at once (rows x VOCAB_SLICE; 16 MiB of float32)
WIDENED_SLICE_BYTES = 1 << 26     # a 16-bit head's slice, copied to float32 for float32 logits
# bound on their temporaries (a KL comparison's are float64) and the widened slice
SCRATCH_BYTES = 64 * LOGITS_BUDGET + WIDENED_SLICE_BYTES


def _bfloat16_instructions() -> bool:
    cpu = getattr(torch, "cpu", None)
    return any(getattr(cpu, name, lambda: False)() for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))


@contextlib.contextmanager
def bfloat16_kernels(weight: torch.Tensor):
    """Float32 matrix products whose operands hold bfloat16 values (a bfloat16 head's slice
    widened, the normed state rounded to it) through oneDNN's bfloat16 kernels where the CPU
    has bfloat16 instructions: products exact in float32, accumulated and returned in float32,
    the same numbers as float32 kernels up to the order of the sums, 3-4 times faster (torch
    has no CPU product of bfloat16 matrices with a float32 result)."""
    matmul = getattr(torch.backends.mkldnn, "matmul", None)
    if weight.dtype != torch.bfloat16 or weight.device.type != "cpu" or matmul is None or not _bfloat16_instructions():
        yield
        return
    before = matmul.fp32_precision
    matmul.fp32_precision = "bf16"
    try:
        yield
    finally:
        matmul.fp32_precision = before


class StreamingSoftmax:
    """What log_softmax over a row of logits gives at the row's target, its log-sum-exp and
    argmax, from the row's logits seen one vocabulary slice at a time."""

    def __init__(self, targets: torch.Tensor, dtype: torch.dtype):
        # targets [rows] ids; dtype of the accumulators
        rows, device = targets.shape[0], targets.device
        self.targets = targets
        self.max = torch.full((rows,), -math.inf, dtype=dtype, device=device)
        self.sum = torch.zeros(rows, dtype=dtype, device=device)       # sum exp(logit - max)
        self.argmax = torch.zeros(rows, dtype=torch.long, device=device)
        self.target = torch.zeros(rows, dtype=dtype, device=device)    # the target's logit

    def add(self, start: int, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """logits [rows, S] of vocabulary ids [start, start + S); returns the factor [rows] by
        which sums of exp(logit - max) taken so far are rescaled, and exp(logits - max) [rows, S]."""
        top, where = logits.max(-1)
        new_max = torch.maximum(self.max, top)
        rescale = torch.exp(self.max - new_max)                          # 0 on the first slice
        weights = torch.exp(logits - new_max[:, None])
        self.sum = self.sum * rescale + weights.sum(-1)
        self.argmax = torch.where(top > self.max, where + start, self.argmax)  # first maximum wins
        self.max = new_max
        # the target's logit where it falls in this slice: a gather and a select, no boolean
        # indexing (on a GPU that asks the host how many rows hit, a sync per slice)
        local = self.targets - start
        hit = (local >= 0) & (local < logits.shape[1])
        picked = logits.gather(1, local.clamp(0, logits.shape[1] - 1)[:, None])[:, 0]
        self.target = torch.where(hit, picked, self.target)
        return rescale, weights

    def lse(self) -> torch.Tensor:
        return self.max + torch.log(self.sum)

    def logprob(self) -> torch.Tensor:
        """log p(target) [rows]."""
        return self.target - self.lse()


def token_nll(head, rows: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """hidden rows [R, hidden], targets [R] -> NLL [R] (float32)."""
    stream = StreamingSoftmax(targets, torch.float32)
    for start, logits in head.logit_slices(rows, VOCAB_SLICE):
        stream.add(start, logits)
    return -stream.logprob()


@torch.inference_mode()
def predicting(hidden: torch.Tensor, lo: int, hi: int, first_from: int) -> torch.Tensor:
    """hidden [T, width] of one row -> [hi - lo, width]: the states that predict targets lo..hi-1,
    target p from position p - 1, the first from `first_from` (lo - 1, or a packed branch's: the
    shared tokens' last)."""
    if first_from == lo - 1:
        return hidden[lo - 1:hi - 1]
    return torch.cat([hidden[first_from:first_from + 1], hidden[lo:hi - 1]])


@torch.inference_mode()
def target_scores(heads: list, states: list[torch.Tensor], targets: np.ndarray, device, dtypes: list[torch.dtype],
                  base_rows: np.ndarray | None = None) -> np.ndarray:
    """states [N, hidden] predicting targets [N] (ids), one per head (the model's, and the KL
    base's), each taken in its head's compute dtype (`dtypes`) -> float64 [N, fields]: the NLL
    alone, or figures.FIELDS; with base_rows [N, row width], a llama.cpp base file's rows of those
    targets, figures.FIELDS against them. The rows go through the head a block at a time, so the
    head's weights are read once a block, whatever spans the rows come from."""
    from .kld import file_token_stats, token_stats

    rows_per_block = max(1, LOGITS_BUDGET // VOCAB_SLICE)
    targets = torch.from_numpy(np.asarray(targets, dtype=np.int64)).to(device)
    out = []
    for a in range(0, len(targets), rows_per_block):
        b = min(a + rows_per_block, len(targets))
        t = targets[a:b]
        rows = [h[a:b].to(device, d) for h, d in zip(states, dtypes)]  # [rows, hidden] each
        if base_rows is not None:
            out.append(file_token_stats(heads[0], rows[0], t, base_rows[a:b]))
        elif len(heads) == 1:
            out.append(token_nll(heads[0], rows[0], t)[:, None])
        else:
            out.append(token_stats(heads, rows, t))
    return torch.cat(out).double().cpu().numpy()


@torch.inference_mode()
def sequence_codes(head, hidden: torch.Tensor, lo: int, hi: int, row_width: int, vocab: int,
                   device, dtype) -> np.ndarray:
    """hidden [T, hidden] of one sequence -> [hi - lo, row_width] uint16: the distributions that
    predict targets lo..hi-1, as llama.cpp's base file holds them (kld.quantized_log_probs), in
    blocks of rows whose whole-vocabulary logits fit LOGITS_BUDGET."""
    from .kld import quantized_log_probs

    per_block = max(1, LOGITS_BUDGET // vocab)
    return np.concatenate([quantized_log_probs(head, hidden[a:min(a + per_block, hi - 1)].to(device, dtype), row_width)
                           for a in range(lo - 1, hi - 1, per_block)])
