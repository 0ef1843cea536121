"""The blockwise recurrent kernels equal their step-by-step references, and a scan split in two
with the state handed over equals the scan in one piece (float64, lengths that are not
multiples of the block)."""
import functools

import pytest
import torch

from pipeline.model.arch.delta_net import delta_rule_blockwise, delta_rule_reference, l2_norm
from pipeline.model.arch.minimax01 import alibi_slopes, lightning_blockwise, lightning_reference
from pipeline.model.arch.ssm import (
    causal_conv1d,
    selective_scan_blockwise,
    selective_scan_reference,
    ssd_blockwise,
    ssd_reference,
)

F64 = dict(dtype=torch.float64)
TOL = dict(rtol=0, atol=1e-10)


def ssd_inputs(b=2, T=150, h=3, p=5, n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, T, h, p, generator=g, **F64), torch.rand(b, T, h, generator=g, **F64),
            -2 * torch.rand(h, generator=g, **F64), torch.randn(b, T, h, n, generator=g, **F64),
            torch.randn(b, T, h, n, generator=g, **F64))


def selective_scan_inputs(b=2, T=150, d=6, n=4, seed=0):
    """Mamba-1's: a decay per channel and state entry, some entries far faster than others."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, T, d, generator=g, **F64), 2 * torch.rand(b, T, d, generator=g, **F64),
            -torch.rand(d, n, generator=g, **F64) * torch.logspace(-1, 1, n, **F64),
            torch.randn(b, T, n, generator=g, **F64), torch.randn(b, T, n, generator=g, **F64))


def delta_inputs(b=2, T=150, h=3, dk=8, dv=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = l2_norm(torch.randn(b, T, h, dk, generator=g, **F64), 1e-6) * dk ** -0.5
    k = l2_norm(torch.randn(b, T, h, dk, generator=g, **F64), 1e-6)
    return (q, k, torch.randn(b, T, h, dv, generator=g, **F64), -torch.rand(b, T, h, generator=g, **F64),
            torch.rand(b, T, h, generator=g, **F64))


def kda_inputs(b=2, T=150, h=3, dk=8, dv=6, seed=0):
    """Kimi Delta Attention's: one decay per key channel, some channels far faster than others."""
    q, k, v, _, beta = delta_inputs(b, T, h, dk, dv, seed)
    g = torch.Generator().manual_seed(seed + 1)
    return q, k, v, -torch.rand(b, T, h, dk, generator=g, **F64) * torch.logspace(-2, 1, dk, **F64), beta


def lightning_inputs(b=2, T=150, h=3, dk=8, dv=6, seed=0):
    """MiniMax's lightning attention: q, k, v, the heads' slopes and a layer's scale of them."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, T, h, d, generator=g, **F64) for d in (dk, dk, dv))
    return q, k, v, alibi_slopes(h).double(), 0.7


# kernel -> (inputs, step-by-step reference, blockwise form, shape of its state)
KERNELS = {"ssd": (ssd_inputs, ssd_reference, ssd_blockwise, (2, 3, 5, 4)),
           "selective_scan": (selective_scan_inputs, selective_scan_reference, selective_scan_blockwise, (2, 6, 4)),
           "delta_rule": (delta_inputs, delta_rule_reference, delta_rule_blockwise, (2, 3, 8, 6)),
           "kda_rule": (kda_inputs, delta_rule_reference, delta_rule_blockwise, (2, 3, 8, 6)),
           # blocks of 32: several, and a partial last one, at these lengths
           "lightning": (lightning_inputs, lightning_reference, functools.partial(lightning_blockwise, block=32),
                         (2, 3, 8, 6))}


@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("T", [1, 63, 64, 150])
@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_blockwise_kernel_equals_reference(kernel, T, with_state):
    inputs, reference, blockwise, state_shape = KERNELS[kernel]
    args = inputs(T=T)
    state = torch.randn(*state_shape, **F64) if with_state else None
    out_ref, state_ref = reference(*args, state)
    out, final = blockwise(*args, state)
    torch.testing.assert_close(out, out_ref, **TOL)
    torch.testing.assert_close(final, state_ref, **TOL)


def test_ssd_groups_share_b_and_c_among_consecutive_heads():
    # 6 heads in 2 groups: heads 0-2 read group 0's B and C, heads 3-5 group 1's
    x, dt, A, B, C = ssd_inputs(T=150, h=6)
    Bg, Cg = B[:, :, :2], C[:, :, 2:4]                                        # [b, T, 2, n]
    expanded = [m.repeat_interleave(3, dim=2) for m in (Bg, Cg)]
    out, final = ssd_blockwise(x, dt, A, Bg, Cg)
    out_ref, state_ref = ssd_reference(x, dt, A, *expanded)
    torch.testing.assert_close(out, out_ref, **TOL)
    torch.testing.assert_close(final, state_ref, **TOL)
    per_head = [ssd_reference(x[:, :, i:i + 1], dt[:, :, i:i + 1], A[i:i + 1], Bg[:, :, i // 3:i // 3 + 1],
                              Cg[:, :, i // 3:i // 3 + 1])[0] for i in range(6)]
    torch.testing.assert_close(out, torch.cat(per_head, dim=2), **TOL)


def test_scans_continue_from_a_handed_over_state():
    for inputs, scan in ((ssd_inputs, ssd_blockwise), (selective_scan_inputs, selective_scan_blockwise)):
        x, dt, A, B, C = inputs(T=150)
        whole, _ = scan(x, dt, A, B, C)
        head, s = scan(x[:, :70], dt[:, :70], A, B[:, :70], C[:, :70])
        tail, _ = scan(x[:, 70:], dt[:, 70:], A, B[:, 70:], C[:, 70:], s)
        torch.testing.assert_close(torch.cat([head, tail], 1), whole, **TOL)

    for inputs in (delta_inputs, kda_inputs):
        q, k, v, g, beta = inputs(T=150)
        whole, _ = delta_rule_blockwise(q, k, v, g, beta)
        head, s = delta_rule_blockwise(q[:, :70], k[:, :70], v[:, :70], g[:, :70], beta[:, :70])
        tail, _ = delta_rule_blockwise(q[:, 70:], k[:, 70:], v[:, 70:], g[:, 70:], beta[:, 70:], s)
        torch.testing.assert_close(torch.cat([head, tail], 1), whole, **TOL)


def test_causal_conv1d_is_causal_and_resumable():
    gen = torch.Generator().manual_seed(0)
    x, w, bias = (torch.randn(2, 40, 6, generator=gen, **F64), torch.randn(6, 4, generator=gen, **F64),
                  torch.randn(6, generator=gen, **F64))
    y, _ = causal_conv1d(x, w, bias)
    # y_t = bias + sum_j w[:, j] x_{t - 3 + j}, zeros before the start
    padded = torch.cat([torch.zeros(2, 3, 6, **F64), x], 1)
    expected = bias + sum(w[:, j] * padded[:, j:j + 40] for j in range(4))
    torch.testing.assert_close(y, expected, **TOL)
    head, state = causal_conv1d(x[:, :25], w, bias)
    tail, _ = causal_conv1d(x[:, 25:], w, bias, state)
    torch.testing.assert_close(torch.cat([head, tail], 1), y, **TOL)


def test_selective_scan_blocks_of_any_length_give_one_scan():
    # the block follows the layer's width (selective_scan_block): 1, 5 and 64 positions at a time agree
    args = selective_scan_inputs(T=150)
    out_ref, state_ref = selective_scan_reference(*args)
    for block in (1, 5, 64):
        out, final = selective_scan_blockwise(*args, block=block)
        torch.testing.assert_close(out, out_ref, **TOL)
        torch.testing.assert_close(final, state_ref, **TOL)
