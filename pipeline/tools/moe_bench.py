"""Benchmark: the chunk size of mixture-of-experts windows (sequences per chunk and batch).

    python -m pipeline.bench --config configs/bench/moe-chunk.toml

A few MoE layers of a model, on the CPU, for each chunk size: the tokens/s of the window with
its experts held (dequantized once per task, so the chunk size only sets the size of each
expert's GEMMs) and in expert slices (each slice dequantized again for every chunk, so a bigger
chunk spreads that over more tokens), and the activation memory the preflight counts for it.
Then where one chunk's compute time goes (torch's profiler, by operator): GEMMs, attention,
routing and the rest.
"""
import statistics
import time
from collections import defaultdict

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
    window.layers.all()   # loaded whole: the chunks are timed alone
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
    print_split(cfg, arch)


# torch operators by what they do in a window (the rest is norms, activations, copies)
KINDS = {"GEMMs": ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear"),
         "attention": ("aten::_scaled_dot_product", "aten::scaled_dot_product"),
         "routing": ("aten::sort", "aten::topk", "aten::bincount", "aten::_softmax", "aten::sigmoid", "aten::gather",
                     "aten::index_add_", "aten::index", "aten::split", "aten::remainder", "aten::floor_divide")}


def time_split(arch, first: int, last: int, dtype, batch: int, ctx: int) -> dict[str, float]:
    """Seconds of one chunk's compute by kind of operator (self time, so nothing counts twice)."""
    from torch.profiler import ProfilerActivity, profile

    window = WindowExecutor(arch, first, last, "cpu", dtype)
    window.layers.all()   # loaded whole: the profile holds one chunk's operators only
    ids = torch.randint(0, arch.hp.vocab, (batch, ctx), generator=torch.Generator().manual_seed(0))
    hidden = arch.embed(ids, "cpu", torch.float32)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        window(hidden)
    window.release()
    split = defaultdict(float)
    for event in prof.key_averages():
        kind = next((k for k, names in KINDS.items() if event.key.startswith(names)), "other")
        split[kind] += event.self_cpu_time_total / 1e6
    return dict(split)


def print_split(cfg: dict, arch) -> None:
    first, last = cfg["layers"]
    split = time_split(arch, first, last, getattr(torch, cfg["compute_dtype"]), cfg["profile_chunk"], cfg["ctx"])
    total = sum(split.values())
    print(f"\nOne chunk of {cfg['profile_chunk']} sequences, held experts: {total:.1f} s of operators; "
          + ", ".join(f"{k} {100 * split.get(k, 0.0) / total:.0f}%" for k in (*KINDS, "other")))
