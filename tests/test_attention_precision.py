"""Every attention form keeps its scores in float32 when it computes in bfloat16: against a
float64 computation over the same bfloat16 inputs, at logits large enough (about +/-60) that
scores rounded to bfloat16 (8 bits: +/-0.25 at 60) would move the softmax by tens of percent."""
import math

import pytest
import torch

from pipeline.model.arch.blocks import Attention, AttentionSpec, SoftCappedAttention
from pipeline.model.arch.gpt_oss import SinkAttention
from pipeline.model.arch.modules import Tables

B, H, KV, T = 2, 4, 2, 96
CAP = 50.0   # Gemma 2's attention logit cap: the logits of +/-60 come out at +/-42
FORMS = {   # name: (attention class, spec fields, key dim, value dim)
    "causal": (Attention, {}, 64, 64),
    "sliding window": (Attention, {"span": 24}, 64, 64),
    "chunked": (Attention, {"chunk": 32}, 64, 64),
    "latent (key 192, value 128)": (Attention, {}, 192, 128),
    "sinks": (SinkAttention, {}, 64, 64),
    "sinks, sliding window": (SinkAttention, {"span": 24}, 64, 64),
    "soft-capped, sliding window": (SoftCappedAttention, {"span": 24}, 64, 64),
}


def reference(q, k, v, mask, scale, sinks=None, cap=None) -> torch.Tensor:
    """softmax(cap(scale q.k) + mask [, sink]) v in float64, each KV head shared by its group."""
    q, k, v = (t.double() for t in (q, k, v))
    k, v = k.repeat_interleave(H // KV, 1), v.repeat_interleave(H // KV, 1)
    scores = (q @ k.transpose(-1, -2)) * scale                           # [B, H, T, T]
    if cap is not None:
        scores = torch.tanh(scores / cap) * cap
    scores = scores.masked_fill(~mask, -math.inf)
    if sinks is not None:
        scores = torch.cat([scores, sinks.double().view(1, H, 1, 1).expand(B, H, T, 1)], -1)
    return scores.softmax(-1)[..., :T] @ v


@pytest.mark.parametrize("form", FORMS)
def test_scores_are_float32_in_a_bfloat16_window(form):
    cls, fields, key_dim, value_dim = FORMS[form]
    g = torch.Generator().manual_seed(0)
    q = (torch.randn(B, H, T, key_dim, generator=g) * 3).bfloat16()
    k = (torch.randn(B, KV, T, key_dim, generator=g) * 3).bfloat16()
    v = torch.randn(B, KV, T, value_dim, generator=g).bfloat16()
    scale = 1 / math.sqrt(key_dim)                                       # logits std 9 * sqrt(key_dim) * scale
    spec = AttentionSpec(n_head=H, n_kv=KV, key_dim=key_dim, value_dim=value_dim, scale=scale, rope=None, **fields)
    sinks = torch.randn(H, generator=g) * 3
    if cls is SoftCappedAttention:
        attention = cls({}, spec, 1e-6, CAP)
    else:
        attention = cls({"sinks": sinks} if cls is SinkAttention else {}, spec, 1e-6)
    tables = Tables(T, "cpu", torch.bfloat16)
    mask = tables.mask(spec.span, spec.chunk)
    mask = torch.ones(T, T, dtype=torch.bool).tril() if mask is None else mask
    with torch.inference_mode():
        got = attention.attend(q, k, v, tables).double()
    want = reference(q, k, v, mask, scale, sinks if cls is SinkAttention else None,
                     CAP if cls is SoftCappedAttention else None)
    # float32 scores leave the output's own rounding to bfloat16: measured 0.008-0.009 for every
    # form; sink attention with bfloat16 scores measured 0.10-0.11
    assert (got - want).abs().max().item() < 0.03
