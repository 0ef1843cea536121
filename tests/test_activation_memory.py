"""The memory preflight counts what the kernels that run hold: on the CPU, for ctx 256 to 8192,
the activations it counts for a window of the real models are at least their measured peak and
at most 1.5 times it. Measured in a child process whose allocator hands every block over 128 KiB
back to the system when it is freed (MALLOC_MMAP_THRESHOLD_), so its peak resident memory
follows what the tensors take: one warm-up batch, then each ctx in turn, the peak reset before."""
import json
import os
import subprocess
import sys

import pytest

from pipeline.gguf_io.reader import GGUFIndex
from pipeline.model.arch import load_architecture
from pipeline.paths import REPO_ROOT
from pipeline.run import preflight

CONTEXTS = [256, 1024, 8192]
BATCH = 4
MEASURE = """
import gc, json, sys, torch
from pipeline.gguf_io.reader import GGUFIndex
from pipeline.model.arch import load_architecture
from pipeline.model.executor import WindowExecutor
from pipeline.model.process import trim
from pipeline.store.timing import peak_rss_mb, reset_peak_rss
arch = load_architecture(GGUFIndex(sys.argv[1]))
window = WindowExecutor(arch, 0, 2, "cpu", torch.float32)
window(torch.zeros(1, 64, arch.hp.hidden))
peaks = {}
for ctx in map(int, sys.argv[2:]):
    x = torch.randn(%d, ctx, arch.hp.hidden)
    gc.collect(); trim(); reset_peak_rss()
    before = peak_rss_mb()
    y = window(x)
    peaks[ctx] = (peak_rss_mb() - before) * 2**20
    del x, y
print(json.dumps(peaks))
""" % BATCH


@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m", "qwen2.5-0.5b"])
def test_counted_activations_bound_the_measured_peak_within_half_again(name, model_path):
    """Plain causal attention (SmolLM2, Qwen2.5's wide MLP) and Gemma-3's sliding window
    (span 512: a boolean mask from ctx 1024 on), the first two layers."""
    path = model_path(name)
    done = subprocess.run([sys.executable, "-c", MEASURE, str(path), *map(str, CONTEXTS)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"})
    assert done.returncode == 0, done.stderr
    measured = {int(k): v for k, v in json.loads(done.stdout.splitlines()[-1]).items()}
    gguf = GGUFIndex(path)
    n_head = load_architecture(gguf).hp.n_head
    for ctx in CONTEXTS:
        counted = preflight.activation_bytes(gguf, BATCH, ctx, n_head, "cpu")
        assert measured[ctx] <= counted <= 1.5 * measured[ctx], (ctx, measured[ctx] / 2**20, counted / 2**20)
