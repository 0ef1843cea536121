"""Benchmark: the chunk size of mixture-of-experts windows (sequences per chunk and batch).

    python -m pipeline.bench --config configs/bench/moe-chunk.toml

A few MoE layers of a model, on the CPU, for each chunk size: the tokens/s of the window with
its experts held (dequantized once per task, so the chunk size only sets the size of each
expert's GEMMs) and in expert slices (each slice dequantized again for every chunk, so a bigger
chunk spreads that over more tokens), and the activation memory the preflight counts for it.
"""
import statistics
import time

import torch

from ..gguf_io.reader import open_gguf
from ..model.arch import load_architecture
from ..model.executor import WindowExecutor
from ..run.preflight import activation_bytes
from .synthetic import synthetic_or_registered


def time_window(arch, first: int, last: int, dtype, slices: int, batch: int, ctx: int,
                reps: int) -> tuple[float, float]:
    """(seconds to load the window, median seconds of one chunk of `batch` sequences)."""
    start = time.perf_counter()
    window = WindowExecutor(arch, first, last, "cpu", dtype, expert_slices=slices)
    load = time.perf_counter() - start
    ids = torch.randint(0, arch.hp.vocab, (batch, ctx), generator=torch.Generator().manual_seed(0))
    hidden = arch.embed(ids, "cpu", torch.float32)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        window(hidden)
        times.append(time.perf_counter() - start)
    window.release()
    return load, statistics.median(times)


def bench_moe_chunks(cfg: dict) -> None:
    path = synthetic_or_registered(cfg["model"], cfg.get("synthetic", {}))
    arch = load_architecture(open_gguf(str(path)))
    first, last = cfg["layers"]
    dtype, ctx = getattr(torch, cfg["compute_dtype"]), cfg["ctx"]
    print(f"\n## {cfg['model']}: layers [{first}..{last}), {cfg['compute_dtype']}, ctx {ctx}, "
          f"{torch.get_num_threads()} threads\n")
    print("| sequences per chunk | held: tokens/s | held: load s | "
          f"{cfg['expert_slices']} slices: tokens/s | activations MB |")
    print("|---|---|---|---|---|")
    for batch in cfg["chunk_sizes"]:
        load, held = time_window(arch, first, last, dtype, 1, batch, ctx, cfg["repetitions"])
        _, sliced = time_window(arch, first, last, dtype, cfg["expert_slices"], batch, ctx, cfg["repetitions"])
        act = activation_bytes(arch.gguf, batch, ctx, arch.hp.n_head) / 2**20
        print(f"| {batch} | {batch * ctx / held:.1f} | {load:.1f} | {batch * ctx / sliced:.1f} | {act:.0f} |")
