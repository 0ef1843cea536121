"""Dequantizers side by side: values/s of each torch dequantizer against gguf-py's numpy one on
the same blocks, and the peak memory of dequantizing a tensor piece by piece against gguf-py
on the whole tensor copied into torch (what the fallback did before it went piece by piece).

    python -m pipeline.bench --config configs/bench/dequant.toml
"""
import json
import os
import subprocess
import sys
import time

import numpy as np

PEAK = """
import json, sys, numpy as np, torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants
from pipeline.gguf_io.dequant import dequantize
from pipeline.store.timing import peak_rss_mb, reset_peak_rss
qtype, values, whole = GGMLQuantizationType[sys.argv[1]], int(sys.argv[2]), sys.argv[3] == "whole"
block, size = GGML_QUANT_SIZES[qtype]
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
    from gguf import GGML_QUANT_SIZES

    block, size = GGML_QUANT_SIZES[qtype]
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
    from gguf import GGMLQuantizationType, quants

    from ..gguf_io.dequant import dequantize

    torch.set_num_threads(cfg["threads"])
    print(f"\n{'type':<8} {'torch Mvalues/s':>16} {'gguf-py Mvalues/s':>18} {'ratio':>6}")
    for name in cfg["types"]:
        qtype = GGMLQuantizationType[name]
        raw = random_blocks(qtype, cfg["values"])
        ours = best_of(lambda: dequantize(raw, qtype), cfg["repetitions"])
        with np.errstate(all="ignore"):   # random scales: some are NaN or inf, on both sides alike
            theirs = best_of(lambda: quants.dequantize(raw, qtype), cfg["repetitions"])
        n = cfg["values"] / 1e6
        print(f"{name:<8} {n / ours:>16,.1f} {n / theirs:>18,.1f} {theirs / ours:>6.2f}")
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
