"""A window's layers loaded by a thread, in order, while the window computes with those loaded.

The first chunk's pass through layer k waits for layer k only, not for the whole window: the
file's bytes of the later layers are read and dequantized beside it (the dequantizers leave the
GIL), into the window's one weight block, so nothing more is held than the window's weights and
the budget is that of the window. What the computation waited is recorded (`waited_s`), with
the loader's own time (`load_s`): the difference is the load the computation hid. On CUDA the
thread issues its copies and kernels on the stream the computation uses (the default one: a
side stream would need events between the two), so they keep their order on the device; what
runs beside the computation is the host's part (the file's pages, the pinned copies).
"""
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import torch


class LayersLoading:
    def __init__(self, load: Callable[[int], torch.nn.Module], layers: range, device: torch.device):
        self.futures: list[Future] = [Future() for _ in layers]
        self.load_s = self.waited_s = 0.0
        self.cancelled = False   # set by finish(): no layer is loaded after it
        self.thread = threading.Thread(target=self.run, args=(load, layers, device), name="layer-load", daemon=True)
        self.thread.start()

    def run(self, load, layers: range, device: torch.device) -> None:
        started = time.perf_counter()
        try:
            if device.type == "cuda" and device.index is not None:   # a thread's current device is its own
                torch.cuda.set_device(device)
            for k, i in enumerate(layers):
                if self.cancelled:
                    raise RuntimeError("the window was released before its layers were loaded")
                self.futures[k].set_result(load(i))
        except BaseException as e:   # raised where the computation asks for this layer or a later one
            for f in self.futures:
                if not f.done():
                    f.set_exception(e)
        self.load_s = time.perf_counter() - started

    def __getitem__(self, k: int) -> torch.nn.Module:
        """Layer k of the window, once loaded."""
        future = self.futures[k]
        if not future.done():
            started = time.perf_counter()
            future.exception()   # waits
            self.waited_s += time.perf_counter() - started
        return future.result()

    def __len__(self) -> int:
        return len(self.futures)

    def all(self) -> list[torch.nn.Module]:
        """Every layer, the loader done."""
        layers = [self[k] for k in range(len(self))]
        self.thread.join()
        return layers

    def finish(self) -> None:
        """The loader stopped after the layer it is loading (a window that failed leaves the rest
        unloaded) and done: nothing writes into the weights after this."""
        self.cancelled = True
        self.thread.join()
