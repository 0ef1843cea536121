"""The mixture-of-experts block against a dense float64 reference that runs every expert on
every token and picks the top-k in plain Python: ties, experts that get no token, all tokens
on the same experts, sigmoid routing with a selection bias and a gated shared expert."""
import math

import pytest
import torch
import torch.nn.functional as F

from pipeline.model.arch.experts import HeldExperts
from pipeline.model.arch.ffn import MLP, MoE, Routing, feed_forward, relu2, route

F64 = dict(dtype=torch.float64)
E, H, FF = 6, 16, 8


def experts(seed=0, gated=True):
    g = torch.Generator().manual_seed(seed)
    up, down = torch.randn(E, FF, H, generator=g, **F64), torch.randn(E, H, FF, generator=g, **F64)
    return up, down, torch.randn(E, FF, H, generator=g, **F64) if gated else None


def dense_reference(x, router, up, down, gate, act, routing, bias=None):
    out = []
    for token in x:
        logits = [float(router[e] @ token) for e in range(E)]
        if routing.gating == "softmax":
            z = sum(math.exp(v) for v in logits)
            probs = [math.exp(v) / z for v in logits]
        else:
            probs = [1 / (1 + math.exp(-v)) for v in logits]
        select = [p + (float(bias[e]) if bias is not None else 0.0) for e, p in enumerate(probs)]
        chosen = sorted(range(E), key=lambda e: (-select[e], e))[:routing.n_used]  # ties: lower index
        weights = [probs[e] for e in chosen]
        if routing.normalize:
            weights = [w / sum(weights) for w in weights]
        y = torch.zeros(H, **F64)
        for e, w in zip(chosen, weights):
            h = act(up[e] @ token) if gate is None else act(gate[e] @ token) * (up[e] @ token)
            y += routing.scale * w * (down[e] @ h)
        out.append(y)
    return torch.stack(out)


def run_moe(x, router, up, down, gate, act, routing, **kw):
    return MoE(router, HeldExperts(up, down, gate), act, routing, **kw)(x.view(1, *x.shape)).view_as(x)


def test_softmax_top2_matches_dense_reference():
    g = torch.Generator().manual_seed(1)
    x, router = torch.randn(40, H, generator=g, **F64), torch.randn(E, H, generator=g, **F64)
    routing = Routing(n_used=2, gating="softmax", normalize=True)
    up, down, gate = experts()
    torch.testing.assert_close(run_moe(x, router, up, down, gate, F.silu, routing),
                               dense_reference(x, router, up, down, gate, F.silu, routing))


def test_ties_go_to_the_lower_expert_index():
    # small integers make every logit exact: experts 1, 3 and 4 share a router row and tie exactly
    g = torch.Generator().manual_seed(2)
    x = torch.randint(-3, 4, (30, H), generator=g).to(torch.float64)
    router = torch.randint(-3, 4, (E, H), generator=g).to(torch.float64)
    router[3] = router[4] = router[1]
    routing = Routing(n_used=2, gating="softmax", normalize=False)
    _, chosen = route(x @ router.T, routing)
    for row, token in zip(chosen.tolist(), x):
        scores = (router @ token).tolist()
        assert row == sorted(range(E), key=lambda e: (-scores[e], e))[:2]
        assert 3 not in row or 1 in row                      # 3 (and 4) only after 1
    assert (chosen == 1).any() and ((chosen[:, 0] == 1) & (chosen[:, 1] == 3)).any()  # the tie happened
    up, down, gate = experts(seed=3)
    torch.testing.assert_close(run_moe(x, router, up, down, gate, F.silu, routing),
                               dense_reference(x, router, up, down, gate, F.silu, routing))


def test_all_tokens_on_the_same_experts_and_idle_experts_cost_nothing():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(25, H, generator=g, **F64).abs()
    router = torch.zeros(E, H, **F64)
    router[2], router[5] = torch.ones(H, **F64), torch.full((H,), 0.5, **F64)  # every token: 2, then 5
    routing = Routing(n_used=2, gating="softmax", normalize=True)
    _, chosen = route(x @ router.T, routing)
    assert (chosen == torch.tensor([2, 5])).all()
    up, down, gate = experts(seed=5)
    up[[0, 1, 3, 4]] = float("nan")  # an expert that receives no token must not be computed
    out = run_moe(x, router, up, down, gate, F.silu, routing)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, dense_reference(x, router, up, down, gate, F.silu, routing))


@pytest.mark.parametrize("normalize", [False, True])
def test_sigmoid_routing_with_selection_bias_and_shared_expert(normalize):
    g = torch.Generator().manual_seed(6)
    x, router = torch.randn(30, H, generator=g, **F64), torch.randn(E, H, generator=g, **F64)
    bias = torch.randn(E, generator=g, **F64)
    routing = Routing(n_used=3, gating="sigmoid", normalize=normalize, scale=2.5)
    up, down, _ = experts(seed=7, gated=False)
    s_up, s_down = torch.randn(FF, H, generator=g, **F64), torch.randn(H, FF, generator=g, **F64)
    shared_gate = torch.randn(1, H, generator=g, **F64)
    out = run_moe(x, router, up, down, None, relu2, routing, selection_bias=bias,
                  shared=MLP(s_up, s_down, None, relu2), shared_gate=shared_gate)
    shared = (s_down @ relu2(s_up @ x.T)).T * torch.sigmoid(x @ shared_gate.T)
    expected = dense_reference(x, router, up, down, None, relu2, routing, bias) + shared
    torch.testing.assert_close(out, expected)
    # the bias changes which experts are chosen, not their weights
    _, unbiased = route(x @ router.T, routing)
    assert not torch.equal(route(x @ router.T, routing, bias)[1], unbiased)


def group_limited_reference(x, router, routing, bias):
    """Experts chosen per token in plain Python: the groups whose two best (biased) scores sum
    highest, then the top-k inside them (llama.cpp's build_moe_ffn, DeepSeek-V3's router)."""
    size = E // routing.n_groups
    chosen_all = []
    for token in x:
        select = [1 / (1 + math.exp(-float(router[e] @ token))) + float(bias[e]) for e in range(E)]
        groups = [select[g * size:(g + 1) * size] for g in range(routing.n_groups)]
        score = [sum(sorted(v, reverse=True)[:2]) for v in groups]
        kept = sorted(range(routing.n_groups), key=lambda g: (-score[g], g))[:routing.n_groups_used]
        allowed = [e for e in range(E) if e // size in kept]
        chosen_all.append(sorted(allowed, key=lambda e: (-select[e], e))[:routing.n_used])
    return chosen_all


def test_group_limited_routing_matches_reference():
    g = torch.Generator().manual_seed(7)
    x, router = torch.randn(60, H, generator=g, **F64), torch.randn(E, H, generator=g, **F64)
    bias = torch.randn(E, generator=g, **F64) * 0.5
    limited = Routing(n_used=2, gating="sigmoid", normalize=True, n_groups=2, n_groups_used=1)
    _, experts_chosen = route(F.linear(x, router), limited, bias)
    assert [sorted(c) for c in experts_chosen.tolist()] == [sorted(c) for c in group_limited_reference(x, router,
                                                                                                    limited, bias)]
    free = Routing(n_used=2, gating="sigmoid", normalize=True)
    _, unlimited = route(F.linear(x, router), free, bias)
    assert not torch.equal(experts_chosen.sort(-1).values, unlimited.sort(-1).values)  # the limit bites


def per_expert_masks(moe, x):
    """The routing loop as it was: a unique and a nonzero per expert (host syncs in each)."""
    flat = x.reshape(-1, x.shape[-1])
    weights, experts = route(F.linear(flat.to(torch.float32), moe.router), moe.routing, moe.selection_bias)
    out = torch.zeros(flat.shape, dtype=weights.dtype)
    for e in torch.unique(experts).tolist():
        token, slot = (experts == e).nonzero(as_tuple=True)
        held = moe.experts
        gate = None if held.gate is None else held.gate[e]
        y = feed_forward(flat[token], held.up[e], held.down[e], gate, moe.act)
        out.index_add_(0, token, y.to(out.dtype) * weights[token, slot, None])
    return out.to(x.dtype).view_as(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_routing_gives_the_per_expert_loop_bit_for_bit(dtype):
    g = torch.Generator().manual_seed(9)
    up, down, gate = (t.to(dtype) for t in experts(seed=9))
    router = torch.randn(E, H, generator=g)
    moe = MoE(router, HeldExperts(up, down, gate), F.silu, Routing(n_used=3, gating="softmax", normalize=True))
    x = torch.randn(2, 50, H, generator=g).to(dtype)
    assert torch.equal(moe(x), per_expert_masks(moe, x))
