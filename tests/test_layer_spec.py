"""The architecture layer on its own: each layer's spec is read from the metadata once, a layer
is a module tree whose tensors are counted from it, attention honours K and V head sizes that
differ and has a seam for kernels SDPA cannot express, and a family ends the logits."""
import math

import pytest
import torch
import torch.nn.functional as F

from pipeline.gguf_io.reader import GGUFIndex
from pipeline.model.arch import load_architecture
from pipeline.model.arch.blocks import Attention, AttentionSpec, module_bytes
from pipeline.model.arch.modules import Tables


def test_gemma3_layers_say_which_attend_locally(model_path):
    arch = load_architecture(GGUFIndex(model_path("gemma3-270m")))
    specs = arch.specs
    assert len(specs) == 18 and [s.index for s in specs] == list(range(18))
    local = [s.index for s in specs if s.attention.span is not None]
    assert local == [i for i in range(18) if (i + 1) % 6]           # every sixth layer is global
    assert {s.attention.span for s in specs} == {512, None}
    assert {s.attention.rope.base for s in specs if s.attention.span} == {10000.0}
    assert {s.attention.rope.base for s in specs if not s.attention.span} == {1000000.0}
    assert all(s.mixer == "attention" and s.ffn == "mlp" for s in specs)


@pytest.mark.parametrize("name,mixers", [
    ("nemotron_h", {"mamba2", "attention", ""}),
    ("qwen3next", {"delta_net", "attention"}),
])
def test_hybrid_layers_name_their_op(name, mixers, tiny_model):
    _, path = tiny_model(name)
    arch = load_architecture(GGUFIndex(path))
    assert {s.mixer for s in arch.specs} == mixers
    for s in arch.specs:
        assert (s.attention is not None) == (s.mixer == "attention")
        if name == "qwen3next" and s.attention is not None:
            assert s.attention.gated
        if name == "nemotron_h":
            assert (s.mixer == "") == (s.ffn != "")                 # one op per layer
            assert s.attention is None or s.attention.rope is None


def test_a_layer_is_a_module_tree_that_counts_its_bytes(model_path):
    arch = load_architecture(GGUFIndex(model_path("smollm2-135m")))
    layer = arch.load_layer(3, "cpu", torch.float32)
    text = str(layer)
    assert "layer 3: attention, mlp" in text and "Attention(heads=9, kv_heads=3" in text and "MLP(act=silu" in text
    file_values = sum(math.prod(t.shape) for t in arch.gguf.layer_tensors(3))
    assert layer.nbytes == module_bytes(layer) == 4 * file_values
    assert len(list(layer.buffers())) == len(arch.gguf.layer_tensors(3))


def attention_reference(x, wq, wk, wv, wo, n_head, n_kv, scale):
    """Plain float64 grouped-query causal attention, no position encoding."""
    B, T, _ = x.shape
    q = (x @ wq.T).view(B, T, n_head, -1).transpose(1, 2)
    k = (x @ wk.T).view(B, T, n_kv, -1).transpose(1, 2).repeat_interleave(n_head // n_kv, dim=1)
    v = (x @ wv.T).view(B, T, n_kv, -1).transpose(1, 2).repeat_interleave(n_head // n_kv, dim=1)
    scores = (q @ k.transpose(-1, -2)) * scale
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)
    y = scores.softmax(-1) @ v                                        # [B, H, T, value_dim]
    return y.transpose(1, 2).reshape(B, T, -1) @ wo.T


def random_attention(key_dim=8, value_dim=12, n_head=4, n_kv=2, hidden=16, cls=Attention):
    g = torch.Generator().manual_seed(0)
    shapes = {"q": (n_head * key_dim, hidden), "k": (n_kv * key_dim, hidden), "v": (n_kv * value_dim, hidden),
              "o": (hidden, n_head * value_dim)}
    w = {name: torch.randn(*shape, generator=g) for name, shape in shapes.items()}
    spec = AttentionSpec(n_head=n_head, n_kv=n_kv, key_dim=key_dim, value_dim=value_dim, scale=key_dim ** -0.5,
                         rope=None)
    return cls({k: v.double() for k, v in w.items()}, spec, eps=1e-6), w


def test_key_and_value_heads_of_different_sizes():
    attn, w = random_attention(key_dim=8, value_dim=12)
    x = torch.randn(2, 10, 16, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    ours = attn(x, Tables(10, "cpu", torch.float64))
    ref = attention_reference(x, *(w[k].double() for k in "qkvo"), 4, 2, 8 ** -0.5)
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-10)


def test_a_family_attention_kernel_replaces_sdpa():
    class SoftCapped(Attention):   # what a soft-capping family will do: its own scores
        def attend(self, q, k, v, tables):
            k, v = (t.repeat_interleave(self.spec.n_head // self.spec.n_kv, dim=1) for t in (k, v))
            scores = 5.0 * torch.tanh((q @ k.transpose(-1, -2)) * self.spec.scale / 5.0)
            T = q.shape[2]
            scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)
            return scores.softmax(-1) @ v
    plain, _ = random_attention()
    capped, _ = random_attention(cls=SoftCapped)
    x = torch.randn(1, 6, 16, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    tables = Tables(6, "cpu", torch.float64)
    assert not torch.allclose(plain(x, tables), capped(x, tables))


def test_a_family_ends_the_logits(model_path):
    arch = load_architecture(GGUFIndex(model_path("smollm2-135m")))
    arch.finish_logits = lambda z: 10.0 * torch.tanh(z / 10.0)      # a final logit soft-cap
    head = arch.load_head("cpu", torch.float32)
    x = torch.randn(3, arch.hp.hidden, generator=torch.Generator().manual_seed(0))
    raw = F.linear(torch.nn.functional.rms_norm(x, (arch.hp.hidden,), head.norm, arch.hp.eps), head.weight)
    sliced = torch.cat([z for _, z in head.logit_slices(x, 10_000)], dim=-1)
    torch.testing.assert_close(sliced, 10.0 * torch.tanh(raw / 10.0), rtol=1e-5, atol=1e-4)
    assert raw.abs().max() > 10 and sliced.abs().max() <= 10

