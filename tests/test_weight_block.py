"""A layer window's weights live in one block, which the next window of the same size takes
over instead of allocating (and page-faulting) its own; no other task keeps it."""
import json
import mmap

import torch

from pipeline.gguf_io.dequant import dequantize
from pipeline.gguf_io.reader import GGUFIndex, open_gguf
from pipeline.gguf_io.registry import fetch_model
from pipeline.model import weight_block
from pipeline.model.arch import load_architecture
from pipeline.model.executor import WindowExecutor

from .helpers import HEAD40K, run_pipeline


def smollm2(model_path):
    arch = load_architecture(open_gguf(str(model_path("smollm2-135m"))))
    ids = torch.randint(0, arch.hp.vocab, (2, 64), generator=torch.Generator().manual_seed(0))
    return arch, arch.embed(ids, "cpu", torch.float32)   # [2, 64, hidden]


def test_every_weight_of_a_window_is_in_its_block(model_path):
    arch, _ = smollm2(model_path)
    window = WindowExecutor(arch, 0, 2, "cpu", torch.float32)
    block, held = window.weights, window.weight_bytes              # once every layer is loaded
    assert block.used == block.data.numel() >= held  # room for each tensor, all taken
    norm = window.layers[0].attn_norm
    start = block.data.data_ptr()
    assert start <= norm.data_ptr() < start + block.data.numel()
    window.release()
    weight_block.drop_kept()


def test_the_next_window_of_that_size_takes_it_over_with_the_same_numbers(model_path):
    arch, x = smollm2(model_path)
    first = WindowExecutor(arch, 0, 2, "cpu", torch.float32)
    hidden = first(x)
    block = first.weights
    first.release()
    second = WindowExecutor(arch, 2, 4, "cpu", torch.float32)
    assert second.weights is block                       # taken over, not allocated
    taken_over = second(hidden)
    second.release()
    weight_block.drop_kept()
    fresh = WindowExecutor(arch, 2, 4, "cpu", torch.float32)
    assert fresh.weights is not block
    assert torch.equal(fresh(hidden), taken_over)
    fresh.release()
    bigger = WindowExecutor(arch, 4, 7, "cpu", torch.float32)
    assert bigger.weights.data.numel() > block.data.numel()     # no room in the kept block: a new one
    bigger_block, expected = bigger.weights, bigger(hidden)
    bigger.release()
    bigger_block.data.fill_(1)
    smaller = WindowExecutor(arch, 4, 6, "cpu", torch.float32)  # room in the kept one: taken over
    assert smaller.weights is bigger_block
    smaller.layers.all()                                         # loaded
    assert smaller.weights.used == smaller.weights.nbytes < bigger_block.data.numel()
    past = -(-smaller.weights.nbytes // mmap.PAGESIZE) * mmap.PAGESIZE
    assert not bigger_block.data[past:].any()                    # the pages it no longer holds were given back
    assert torch.equal(WindowExecutor(arch, 6, 7, "cpu", torch.float32)(smaller(hidden)), expected)
    smaller.release()
    weight_block.drop_kept()


def test_no_block_is_kept_past_the_last_window_and_each_window_reads_the_next_ahead(tmp_path, monkeypatch):
    """Each window asks the kernel for its own file pages as it starts loading (the disk reads
    ahead of the dequantization) and, once loaded, for the next window's (the last one for the
    LM head's) while it computes; its manifest says how long it waited on the file."""
    asked = []
    monkeypatch.setattr(GGUFIndex, "read_ahead", lambda self, names, limit: asked.append(sorted(names)))
    run_pipeline(tmp_path, task="wikitext-2", corpus=str(HEAD40K), ctx=128, chunks=2, window_layers=10)
    assert weight_block._kept is None                   # the Score task let it go
    gguf = GGUFIndex(fetch_model("smollm2-135m"))
    layers = lambda a, b: sorted(t.name for i in range(a, b) for t in gguf.layer_tensors(i))  # noqa: E731
    assert asked == [layers(0, 10), layers(10, 20), layers(10, 20), layers(20, 30), layers(20, 30),
                     ["token_embd.weight"]]                                  # tied embeddings: the head
    manifests = [json.loads(m.read_text()) for m in (tmp_path / "LayerWindow").glob("*/manifest.json")]
    assert len(manifests) == 3 and all(0 < m["weight_read_wait_s"] < m["weight_load_s"] for m in manifests)
    assert all(0 <= m["weight_load_waited_s"] <= m["weight_load_s"] for m in manifests)


def test_a_bfloat16_moe_window_holds_every_tensor_in_its_block(tiny_model):
    # routers, selection biases and norms are held in float32: the block is sized for it, so no
    # tensor of the window is allocated beside it (memory the preflight would not have counted)
    _, path = tiny_model("nemotron_h_moe")
    arch = load_architecture(GGUFIndex(path))
    window = WindowExecutor(arch, 0, arch.hp.n_layers, "cpu", torch.bfloat16)
    start = window.weights.data.data_ptr()
    end = start + window.weights.data.numel()
    held = [(name, t) for layer in window.layers for name, t in layer.named_buffers()]
    assert held and all(start <= t.data_ptr() < end for _, t in held)
    wide = {name.rsplit(".", 1)[-1] for name, t in held if t.dtype == torch.float32}
    assert {"router", "selection_bias", "norm", "A", "D", "dt_bias"} <= wide


def test_norm_weights_keep_their_float32_bits_in_bfloat16(model_path):
    # Gemma stores its norms as 1 + w: rounded to bfloat16 they would lose w's low bits
    gguf = GGUFIndex(model_path("gemma3-270m"))
    arch = load_architecture(gguf)
    layer = arch.load_layer(0, "cpu", torch.bfloat16)
    norm = layer.attn_norm
    exact = dequantize(gguf.raw("blk.0.attn_norm.weight"), gguf.tensors["blk.0.attn_norm.weight"].qtype)
    assert norm.dtype == torch.float32 and torch.equal(norm, exact)
    assert not torch.equal(exact.to(torch.bfloat16).float(), exact)   # the test would see the rounding
    assert layer.attention.w["q"].dtype == torch.bfloat16        # the matrices stay in the compute dtype
