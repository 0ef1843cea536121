"""Preflight: what a pass needs against what its devices and its disk have, so that a run
that cannot fit is refused in one line (with the window size that does fit) instead of
swapping, filling the disk or being killed half way.

Memory is checked before a pass starts; the disk once the corpus is tokenized and the number
of sequences, so the size of a boundary, is known (before the first boundary is written)."""
import os
from pathlib import Path

import numpy as np

from ..errors import UserError
from ..gguf_io.reader import GGUFIndex
from . import cuda_probe

GiB = 2 ** 30
RUNTIME_BYTES = 512 * 2 ** 20   # the interpreter, torch and the Zarr stores of a window task


def layer_weight_bytes(gguf: GGUFIndex, i: int, dtype) -> int:
    """Bytes the dequantized tensors of block `i` take for compute in `dtype` (torch dtype)."""
    from ..model.weight_block import tensor_bytes

    return sum(tensor_bytes(t, dtype) for t in gguf.layer_tensors(i))


def activation_bytes(gguf: GGUFIndex, batch: int, ctx: int, n_head: int) -> int:
    """A generous bound on one forward batch: a few hidden-sized and FFN-sized float32 tensors
    per token, attention scores [batch, heads, ctx, ctx] and the boundary chunks in and out.
    Causal attention runs in a fused kernel; a sliding window's boolean mask may send it (with
    grouped-query heads, on a GPU) to the math kernel, which holds the scores, the masked scores
    and their softmax at once: three such float32 tensors."""
    from gguf import Keys

    widest = max((t.shape[-2] for n, t in gguf.tensors.items() if n.startswith("blk.0.") and len(t.shape) >= 2),
                 default=0)
    hidden = gguf.tensors["token_embd.weight"].shape[-1]
    span = int(gguf.arch_value(Keys.Attention.SLIDING_WINDOW, 0) or 0)
    score_tensors = 3 if 0 < span < ctx else 1
    return 4 * batch * ctx * (8 * hidden + 3 * widest) + score_tensors * 4 * batch * n_head * ctx * ctx


def available_bytes(device: str) -> int:
    """Memory a window task may use now: free device memory on CUDA (asked in a child process,
    cuda_probe.py); on the CPU the kernel's MemAvailable, capped by the cgroup limit where one is set."""
    if device.startswith("cuda"):
        return cuda_probe.cuda_facts()["free"]
    free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free = int(line.split()[1]) * 1024
    limit = Path("/sys/fs/cgroup/memory.max")
    if limit.is_file() and limit.read_text().strip().isdigit():
        used = Path("/sys/fs/cgroup/memory.current")
        free = min(free, int(limit.read_text()) - (int(used.read_text()) if used.is_file() else 0))
    return free


def largest_fitting_window(per_layer: list[int], fixed: int, budget: int) -> int:
    """The most consecutive layers that fit `budget` wherever the window falls (0: none)."""
    for size in range(len(per_layer), 0, -1):
        if max(sum(per_layer[a:a + size]) for a in range(len(per_layer) - size + 1)) + fixed <= budget:
            return size
    return 0


def check_windows_fit(windows, per_layer: list[int], fixed: int, dtype_names: dict[str, str],
                      available: dict[str, int]) -> None:
    """Refuse the placement when a window's weights plus `fixed` exceed its device's memory.
    per_layer: weight bytes of each layer in its window's compute dtype."""
    for w in windows:
        need = sum(per_layer[w.first:w.last]) + fixed
        if need <= available[w.device]:
            continue
        fits = largest_fitting_window(per_layer, fixed, available[w.device])
        advice = f"--window-layers {fits} fits" if fits else "not even one layer fits"
        raise UserError(
            f"layers [{w.first}..{w.last}) on {w.device} need about {need / GiB:.1f} GiB "
            f"({sum(per_layer[w.first:w.last]) / GiB:.1f} GiB of {dtype_names[w.device]} weights) but "
            f"{available[w.device] / GiB:.1f} GiB are available; {advice}")


def check_memory(gguf: GGUFIndex, windows, n_layers: int, n_head: int, batch: int, ctx: int,
                 dtype_names: dict[str, str], heads: list[GGUFIndex] | None = None) -> None:
    """Check every window of a placement against its device's memory before the pass starts,
    and the Score task's `heads` (the model's own by default; with a KL base, both) on the last
    window's device."""
    import torch

    dtypes = {d: getattr(torch, name) for d, name in dtype_names.items()}
    fixed = RUNTIME_BYTES + activation_bytes(gguf, batch, ctx, n_head)
    for device in sorted({w.device for w in windows}):
        per_layer = [layer_weight_bytes(gguf, i, dtypes[device]) for i in range(n_layers)]
        check_windows_fit([w for w in windows if w.device == device], per_layer, fixed, dtype_names,
                          {device: available_bytes(device)})
    last = windows[-1].device
    check_heads_fit(heads or [gguf], last, dtype_names[last], dtypes[last].itemsize, available_bytes(last))


def check_heads_fit(ggufs: list[GGUFIndex], device: str, dtype_name: str, element_size: int, available: int) -> None:
    """The Score task holds the dequantized LM head of each model it scores (two with a KL base)
    and a block of logits (rows x a slice of the vocabulary) with their temporaries on the last
    window's device."""
    from ..model.scoring import SCRATCH_BYTES

    names = ["output.weight" if "output.weight" in g.tensors else "token_embd.weight" for g in ggufs]
    weights = sum(element_size * int(np.prod(g.tensors[n].shape)) for g, n in zip(ggufs, names))
    need = RUNTIME_BYTES + weights + SCRATCH_BYTES
    if need > available:
        what = f"the LM head ({names[0]})" if len(ggufs) == 1 else "the LM heads of the model and its KL base"
        advice = "; --compute-dtype bfloat16 halves it" if element_size == 4 else ""
        raise UserError(f"{what} on {device} needs about {need / GiB:.1f} GiB "
                        f"({weights / GiB:.1f} GiB of {dtype_name} weights) but {available / GiB:.1f} GiB "
                        f"are available{advice}")


def check_disk(shape: tuple[int, int, int], boundary_dtype: str, alive: int, free: int | None, run_root: str) -> None:
    """Refuse a pass whose boundaries ([sequences, ctx, hidden], `alive` of them on disk at
    once) and scores cannot fit the `free` bytes of the run root's disk (None: an object store)."""
    width = 4 if boundary_dtype == "float32" else 2
    need = alive * width * int(np.prod(shape)) + 8 * shape[0] * shape[1]
    if free is not None and need > free:
        raise UserError(f"the pass needs about {need / GiB:.2f} GiB under {run_root} "
                        f"({alive} boundaries of {shape}) but {free / GiB:.2f} GiB are free")
