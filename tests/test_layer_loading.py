"""A window's layers load beside its first chunk's computation: the chunk goes through layer 0
while the later layers are still being read, with the numbers of a window loaded whole first."""
import time

import pytest
import torch

from pipeline.errors import UserError
from pipeline.gguf_io.reader import open_gguf
from pipeline.model.arch import load_architecture
from pipeline.model.executor import WindowExecutor
from pipeline.model.weight_block import drop_kept


@pytest.fixture
def smollm2(model_path):
    arch = load_architecture(open_gguf(str(model_path("smollm2-135m"))))
    ids = torch.randint(0, arch.hp.vocab, (2, 32), generator=torch.Generator().manual_seed(0))
    return arch, arch.embed(ids, "cpu", torch.float32)   # [2, 32, hidden]


def slowed(arch, monkeypatch, events: list, fail_at: int | None = None):
    """arch.load_layer taking 0.3 s more for every layer but the window's first, each load and
    each layer's first computation recorded in `events`."""
    load = type(arch).load_layer

    def load_layer(self, i, *args, **kwargs):
        if i != 0:
            time.sleep(0.3)
        if i == fail_at:
            raise UserError(f"layer {i} cannot be read")
        layer = load(self, i, *args, **kwargs)
        forward = layer.forward

        def recorded(*a, **k):
            events.append(("computed", i))
            return forward(*a, **k)
        layer.forward = recorded
        events.append(("loaded", i))
        return layer
    monkeypatch.setattr(type(arch), "load_layer", load_layer)


def test_the_first_chunk_goes_through_the_first_layer_while_the_last_loads(smollm2, monkeypatch):
    arch, x = smollm2
    whole = WindowExecutor(arch, 0, 4, "cpu", torch.float32)
    whole.layers.all()
    expected = whole(x)
    whole.release()
    drop_kept()
    events = []
    slowed(arch, monkeypatch, events)
    window = WindowExecutor(arch, 0, 4, "cpu", torch.float32)
    assert torch.equal(window(x), expected)
    assert events.index(("computed", 0)) < events.index(("loaded", 3))
    loading = window.loading()
    assert loading["weight_load_s"] >= 0.9 and loading["weight_load_waited_s"] < loading["weight_load_s"]
    window.release()
    drop_kept()


def test_a_layer_that_cannot_load_stops_the_chunk_that_reaches_it(smollm2, monkeypatch):
    arch, x = smollm2
    events = []
    slowed(arch, monkeypatch, events, fail_at=2)
    window = WindowExecutor(arch, 0, 4, "cpu", torch.float32)
    with pytest.raises(UserError, match="layer 2 cannot be read"):
        window(x)
    assert ("computed", 1) in events and ("loaded", 3) not in events   # nothing loaded past it
    window.release()
    drop_kept()


def test_a_window_released_after_a_failure_loads_no_more_layers(smollm2, monkeypatch):
    """A chunk that fails (the device out of memory, say) ends the window: its loader stops
    after the layer it is loading, not dequantizing the rest into memory no one uses."""
    arch, x = smollm2
    events = []
    slowed(arch, monkeypatch, events)
    window = WindowExecutor(arch, 0, 4, "cpu", torch.float32)
    window.layers[0].forward = lambda *a, **k: (_ for _ in ()).throw(torch.OutOfMemoryError("no room"))
    with pytest.raises(torch.OutOfMemoryError):
        window(x)
    window.release()
    assert ("loaded", 0) in events and ("loaded", 3) not in events
    drop_kept()
