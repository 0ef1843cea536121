"""Dequantizers side by side: values/s of layercycle's host dequantizer of each type (a compiled
loop where the type has one, else the torch operations) against gguf-py's numpy one on the same
blocks; MB/s of file bytes read from a file in the page cache, as a window's load reads
them (its pages mapped anew each time), into float32 and bfloat16 (a type gguf-py cannot
dequantize, as Q1_0 and Q2_0, shows layercycle's rate alone); and the peak memory of
dequantizing a tensor piece by piece against gguf-py on the whole tensor copied into torch (what
the fallback did before it went piece by piece).

    python -m pipeline.bench --config configs/bench/dequant.toml
"""
import json
import mmap
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

PEAK = """
import json, sys, numpy as np, torch
from gguf import quants
from pipeline.gguf_io.dequant import dequantize
from pipeline.gguf_io.ggml_types import QUANT_SIZES, type_named
from pipeline.store.timing import peak_rss_mb, reset_peak_rss
qtype, values, whole = type_named(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "whole"
block, size = QUANT_SIZES[qtype]
raw = np.random.default_rng(0).integers(0, 256, (values // block, size), dtype=np.uint8)
raw[:, :2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)   # finite scales
reset_peak_rss()
base = peak_rss_mb()
if whole:   # gguf-py on the whole tensor, then into torch
    out = torch.from_numpy(np.array(quants.dequantize(raw, qtype), dtype=np.float32))
else:
    out = dequantize(raw, qtype)
print(json.dumps({"extra_mb": peak_rss_mb() - base, "out_mb": out.numel() * 4 / 2**20}))
"""


def random_blocks(qtype, n_values: int) -> np.ndarray:
    from ..gguf_io.ggml_types import QUANT_SIZES

    block, size = QUANT_SIZES[qtype]
    return np.random.default_rng(1).integers(0, 256, (n_values // block, size), dtype=np.uint8)


def best_of(fn, repetitions: int) -> float:
    times = []
    for _ in range(repetitions):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def bench_dequantizers(cfg: dict) -> None:
    import torch
    from gguf import quants

    from ..gguf_io.dequant import COMPILED_LOOPS, dequantize
    from ..gguf_io.ggml_types import type_named

    torch.set_num_threads(cfg["threads"])
    COMPILED_LOOPS[0] = True   # as in a pass over a large model: the compiled loop where a type has one
    print(f"\n{'type':<8} {'layercycle Mvalues/s':>21} {'gguf-py Mvalues/s':>18} {'ratio':>6}")
    for name in cfg["types"]:
        qtype = type_named(name)
        raw = random_blocks(qtype, cfg["values"])
        ours = best_of(lambda: dequantize(raw, qtype), cfg["repetitions"])
        n = cfg["values"] / 1e6
        try:
            with np.errstate(all="ignore"):   # random scales: some are NaN or inf, on both sides alike
                theirs = best_of(lambda: quants.dequantize(raw, qtype), cfg["repetitions"])
        except NotImplementedError:           # a type only ggml has
            print(f"{name:<8} {n / ours:>21,.1f} {'-':>18} {'-':>6}")
            continue
        print(f"{name:<8} {n / ours:>21,.1f} {n / theirs:>18,.1f} {theirs / ours:>6.2f}")
    bench_file_rates(cfg)
    name, values = cfg["fallback_type"], cfg["fallback_values"]
    print(f"\n{name}, {values / 2**20:.0f} Mi values ({values * 4 / 2**30:.1f} GiB of float32): peak memory above "
          f"the process's before dequantizing")
    env = {**os.environ, "OMP_NUM_THREADS": str(cfg["threads"])}
    for how in ("pieces", "whole"):
        done = subprocess.run([sys.executable, "-c", PEAK, name, str(values), how], capture_output=True, text=True,
                              env=env, check=True)
        r = json.loads(done.stdout.splitlines()[-1])
        label = "layercycle, piece by piece" if how == "pieces" else "gguf-py on the whole tensor"
        print(f"  {label:<28} {r['extra_mb']:>8,.0f} MB  (the output itself: {r['out_mb']:,.0f} MB)")


def bench_file_rates(cfg: dict) -> None:
    """MB/s of file bytes into float32 and bfloat16, from a file in the page cache whose pages are
    dropped from the process before each repetition, as a window's load finds them: into a
    weight block kept from the last window (every window but the first), into a new one (the
    first), and, beside them, through the torch dequantizers a GPU runs, here on the CPU."""
    from ..gguf_io.ggml_types import type_named

    print(f"\n{'MB/s of file bytes':<18} {'into float32':>38} {'into bfloat16':>38}")
    print(f"{'type':<8} {'file MB':>9}" + f" {'kept block':>12} {'new block':>12} {'torch ops':>12}" * 2)
    with tempfile.TemporaryDirectory() as tmp:
        for name in cfg["file_rate_types"]:
            qtype = type_named(name)
            blocks = random_blocks(qtype, cfg["values"])
            path = Path(tmp) / name
            blocks.tofile(path)
            with open(path, "rb") as f:
                mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            rates = file_rates(mapped, blocks.shape, qtype, cfg["repetitions"])
            mapped.close()
            print(f"{name:<8} {blocks.nbytes / 1e6:>9.1f}" + "".join(f" {r:>12,.0f}" for r in rates))


def file_rates(mapped: mmap.mmap, shape: tuple, qtype, repetitions: int) -> list[float]:
    """[kept, new, torch] MB/s into float32, then the same into bfloat16."""
    import torch

    from ..gguf_io.dequant import COMPILED_LOOPS, dequantize
    from ..gguf_io.ggml_types import QUANT_SIZES
    from ..model.weight_block import WeightBlock

    raw = np.frombuffer(mapped, dtype=np.uint8).reshape(shape)
    raw.max()                                   # the file in the page cache
    values = shape[0] * QUANT_SIZES[qtype][0]

    def load(dtype, block: WeightBlock | None):
        mapped.madvise(mmap.MADV_DONTNEED)      # its pages faulted in anew, from the cache
        block = block or WeightBlock(values * dtype.itemsize, "cpu")
        dequantize(raw, qtype, dtype=dtype, out=block.data.view(dtype))

    def torch_ops(dtype):
        COMPILED_LOOPS[0] = False
        try:
            load(dtype, kept)
        finally:
            COMPILED_LOOPS[0] = True

    rates = []
    for dtype in (torch.float32, torch.bfloat16):
        kept = WeightBlock(values * dtype.itemsize, "cpu")
        for fn in (lambda: load(dtype, kept), lambda: load(dtype, None), lambda: torch_ops(dtype)):
            rates.append(raw.nbytes / 1e6 / best_of(fn, repetitions))
    return rates
