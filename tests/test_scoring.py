"""The LM head applied one vocabulary slice at a time gives what a full log-softmax gives."""
import torch

from pipeline.model import scoring
from pipeline.model.arch.modules import Head
from pipeline.model.kld import token_stats


def random_head(vocab: int, hidden: int, seed: int) -> Head:
    g = torch.Generator().manual_seed(seed)
    return Head(1 + 0.1 * torch.randn(hidden, generator=g), torch.randn(vocab, hidden, generator=g) / hidden ** 0.5,
                1e-6)


def test_slices_give_the_full_log_softmax(monkeypatch):
    monkeypatch.setattr(scoring, "VOCAB_SLICE", 37)  # 1000 = 27 slices of 37 and one of 1
    head = random_head(1000, 16, seed=0)
    rows = torch.randn(50, 16, generator=torch.Generator().manual_seed(1)) * 3
    targets = torch.tensor([0, 36, 37, 999] + list(range(100, 146)))    # slice edges included
    full = torch.log_softmax(head(rows).double(), -1)
    nll = scoring.token_nll(head, rows, targets)
    assert torch.allclose(nll.double(), -full.gather(1, targets[:, None])[:, 0], atol=2e-5, rtol=0)

    stream = scoring.StreamingSoftmax(targets, torch.float64)
    logits = head(rows).double()
    logits[:5, 500] = logits[:5, 40] = logits[:5].max(-1).values + 1      # ties across slices
    for start in range(0, 1000, 37):
        stream.add(start, logits[:, start:start + 37])
    assert torch.equal(stream.argmax, logits.argmax(-1))                # the first maximum wins
    assert (stream.argmax[:5] == 40).all()
    assert torch.allclose(stream.lse(), torch.logsumexp(logits, -1), atol=1e-12, rtol=0)


def test_kl_statistics_over_slices_equal_a_float64_computation(monkeypatch):
    monkeypatch.setattr(scoring, "VOCAB_SLICE", 64)
    model, base = random_head(300, 16, seed=2), random_head(300, 16, seed=3)
    g = torch.Generator().manual_seed(4)
    x, xb = torch.randn(40, 16, generator=g), torch.randn(40, 16, generator=g)
    targets = torch.randint(0, 300, (40,), generator=g)
    stats = token_stats([model, base], [x, xb], targets)

    lq, lb = (torch.log_softmax(h(r).double(), -1) for h, r in ((model, x), (base, xb)))
    kld = (lb.exp() * (lb - lq)).sum(-1)
    tq, tb = lq.gather(1, targets[:, None])[:, 0], lb.gather(1, targets[:, None])[:, 0]
    expected = torch.stack([-tq, -tb, kld, (lq.argmax(-1) == lb.argmax(-1)).double(), tq.exp() - tb.exp()], -1)
    assert kld.min() > 0.01
    assert torch.allclose(stats, expected, atol=1e-5, rtol=1e-5)
    same = token_stats([model, model], [x, x], targets)
    assert torch.equal(same[:, 2], torch.zeros(40, dtype=torch.float64)) and same[:, 3].all()


def test_a_bfloat16_head_gives_float32_logits(monkeypatch):
    """Held in bfloat16, the head's logits are still accumulated and kept in float32: at logits
    near 20 a bfloat16 result would lie on a 0.125 grid. The head multiplies the normed state
    rounded to bfloat16 (as every product of a bfloat16 trunk does; on a CPU with bfloat16
    instructions oneDNN's bfloat16 kernels compute it). The slices of a head whose widened copy
    would pass WIDENED_SLICE_BYTES are narrowed (the last one shorter, through the same buffer)."""
    head = random_head(1000, 64, seed=5)
    head.weight = head.weight.bfloat16() * 8                        # logits up to about 30
    rows = torch.randn(20, 64, generator=torch.Generator().manual_seed(6)) * 3
    normed = rms_norm_reference(rows, head)
    exact = torch.nn.functional.linear(normed.bfloat16().double(), head.weight.double())   # float64
    monkeypatch.setattr("pipeline.model.arch.modules.WIDENED_SLICE_BYTES", 4 * 64 * 128)
    slices = list(head.logit_slices(rows.bfloat16(), 512))
    assert [s for s, _ in slices] == list(range(0, 1000, 128))      # narrowed from 512 to 128
    ours = torch.cat([z for _, z in slices], dim=-1)
    assert ours.dtype == torch.float32 and ours.device.type == "cpu" and exact.abs().max() > 16
    assert (ours.double() - exact).abs().max() < 1e-4
    rounded = torch.nn.functional.linear(normed.bfloat16(), head.weight).double()
    assert (rounded - exact).abs().max() > 0.03                      # what the test tells apart
    unrounded_input = torch.nn.functional.linear(normed.double(), head.weight.double())
    assert (unrounded_input - exact).abs().max() > 1e-3


def rms_norm_reference(x: torch.Tensor, head: Head) -> torch.Tensor:
    """The head's norm of bfloat16-rounded rows, float64."""
    x = x.bfloat16().double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + head.eps) * head.norm.double()
