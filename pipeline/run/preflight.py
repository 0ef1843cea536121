"""Preflight: what a pass needs against what its devices and its disk have, so that a run
that cannot fit is refused in one line (with the window size that does fit) instead of
swapping, filling the disk or being killed half way.

Memory is checked before a pass starts; the disk once the corpus is tokenized and the number
of sequences, so the size of a boundary, is known (before the first boundary is written)."""
import os
import re
from pathlib import Path

import numpy as np

from ..errors import UserError
from ..gguf_io.reader import GGUFIndex
from . import cuda_probe
from .placement import window_bytes

GiB = 2 ** 30
RUNTIME_BYTES = 512 * 2 ** 20   # the interpreter, torch and the Zarr stores of a window task
# the share of a device's total memory that auto-sized windows plan for, without --device-memory
AUTO_SHARE = {"cpu": 0.75, "cuda": 0.9}
UNITS = {"KIB": 2 ** 10, "MIB": 2 ** 20, "GIB": 2 ** 30}


def layer_weight_bytes(gguf: GGUFIndex, i: int, dtype) -> int:
    """Bytes the dequantized tensors of block `i` take for compute in `dtype` (torch dtype)."""
    from ..model.arch import load_architecture
    from ..model.weight_block import tensor_bytes

    arch = load_architecture(gguf)
    return sum(tensor_bytes(arch, t, dtype) for t in gguf.layer_tensors(i))


def activation_bytes(gguf: GGUFIndex, batch: int, ctx: int, n_head: int, device: str = "cpu") -> int:
    """What one forward batch of [batch, ctx] tokens holds at its peak besides the weights, on
    `device`, as the model's family counts it (DecoderArch.activation_bytes)."""
    from ..model.arch import load_architecture

    return load_architecture(gguf).activation_bytes(batch, ctx, n_head, device)


def parse_size(text: str) -> int:
    """--device-memory: a number with KiB, MiB or GiB (`12GiB`, `1.5 GiB`) -> bytes."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMG]iB)\s*", text, flags=re.IGNORECASE)
    if not match or float(match.group(1)) <= 0:
        raise UserError(f"--device-memory {text!r}: give a size such as 12GiB, 512MiB or 1.5GiB")
    return int(float(match.group(1)) * UNITS[match.group(2).upper()])


CGROUP = Path("/sys/fs/cgroup")      # cgroup v2: this process's memory controller's files


def cgroup_limit() -> int | None:
    limit = CGROUP / "memory.max"
    text = limit.read_text().strip() if limit.is_file() else ""
    return int(text) if text.isdigit() else None


def cgroup_free() -> int | None:
    """What the cgroup's limit leaves, as the kernel counts it (and the kubelet's working set):
    the limit less the memory charged to the cgroup, its inactive file pages not counted
    (memory.stat's inactive_file: the page cache a pass fills on purpose by reading ahead, which
    the kernel reclaims before an allocation fails). None where no limit is set."""
    limit = cgroup_limit()
    if limit is None:
        return None
    used = CGROUP / "memory.current"
    charged = int(used.read_text()) if used.is_file() else 0
    stat = CGROUP / "memory.stat"
    for line in stat.read_text().splitlines() if stat.is_file() else []:
        key, _, value = line.partition(" ")
        if key == "inactive_file":
            charged -= int(value)
    return limit - max(charged, 0)


def total_bytes(device: str) -> int:
    """A device's memory: on CUDA the card's (asked in a child process); on the CPU MemTotal,
    capped by the cgroup limit where one is set."""
    if device.startswith("cuda"):
        return cuda_probe.cuda_facts()["total"]
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    limit = cgroup_limit()
    return total if limit is None else min(total, limit)


def device_budget(device: str, cap: int | None) -> int:
    """What the windows on `device` are planned for: --device-memory where given, else a share
    of the device's total memory. Not its free memory, which changes from run to run: a rerun
    after a crash plans the same windows, so it finds the outputs the first run left."""
    return cap if cap is not None else int(AUTO_SHARE["cuda" if device.startswith("cuda") else "cpu"]
                                           * total_bytes(device))


def window_fixed_bytes(gguf: GGUFIndex, batch: int, ctx: int, n_head: int, device: str = "cpu") -> int:
    """What a window task on `device` holds besides its weights."""
    return RUNTIME_BYTES + activation_bytes(gguf, batch, ctx, n_head, device)


def available_bytes(device: str) -> int:
    """Memory a window task may use now: free device memory on CUDA (asked in a child process,
    cuda_probe.py); on the CPU the kernel's MemAvailable, capped by what the cgroup's limit leaves
    where one is set."""
    if device.startswith("cuda"):
        return cuda_probe.cuda_facts()["free"]
    free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free = int(line.split()[1]) * 1024
    in_cgroup = cgroup_free()
    return free if in_cgroup is None else min(free, in_cgroup)


def largest_fitting_window(per_layer: list[int], fixed: int, budget: int) -> int:
    """The most consecutive layers that fit `budget` wherever the window falls (0: none)."""
    for size in range(len(per_layer), 0, -1):
        if max(sum(per_layer[a:a + size]) for a in range(len(per_layer) - size + 1)) + fixed <= budget:
            return size
    return 0


def layer_experts(gguf: GGUFIndex, i: int, dtype) -> tuple[int, int]:
    """(bytes, count) of block `i`'s routed experts dequantized for compute in `dtype`; (0, 0)
    where it has none, or its family holds them whole (they never run in slices)."""
    from ..model.arch import load_architecture
    from ..model.arch.experts import expert_tensor_names
    from ..model.weight_block import tensor_bytes

    names = expert_tensor_names(gguf, i)
    arch = load_architecture(gguf)
    if not names or not arch.sliceable_experts:   # experts held whole: the layer fits or is refused
        return 0, 0
    return (sum(tensor_bytes(arch, gguf.tensors[n], dtype) for n in names.values()),
            gguf.tensors[names["down"]].shape[0])


def layer_costs(gguf: GGUFIndex, n_layers: int, dtype, layers: range | None = None) -> tuple[list, list]:
    """Per layer of the trunk: its weight bytes for compute in `dtype` and its routed experts'
    (bytes, count); zeros outside `layers` (default: every layer)."""
    layers = range(n_layers) if layers is None else layers
    per_layer, experts = [0] * n_layers, [(0, 0)] * n_layers
    for i in layers:
        per_layer[i], experts[i] = layer_weight_bytes(gguf, i, dtype), layer_experts(gguf, i, dtype)
    return per_layer, experts


def check_windows_fit(windows, per_layer: list[int], fixed: int, dtype_names: dict[str, str],
                      available: dict[str, int], experts: list[tuple[int, int]] | None = None) -> None:
    """Refuse the placement when a window's weights plus `fixed` exceed its device's memory.
    per_layer: weight bytes of each layer in its window's compute dtype; experts: (bytes,
    count) of each layer's routed experts, of which a window in expert slices holds one slice."""
    experts = experts or [(0, 0)] * len(per_layer)
    for w in windows:
        weights = window_bytes(per_layer, experts, w)
        if weights + fixed <= available[w.device]:
            continue
        fits = largest_fitting_window(per_layer, fixed, available[w.device])
        advice = f"--window-layers {fits} fits" if fits else "not even one layer fits"
        raise UserError(
            f"layers [{w.first}..{w.last}) on {w.device} need about {(weights + fixed) / GiB:.1f} GiB "
            f"({weights / GiB:.1f} GiB of {dtype_names[w.device]} weights) but "
            f"{available[w.device] / GiB:.1f} GiB are available; {advice}")


def check_memory(gguf: GGUFIndex, windows, n_layers: int, n_head: int, batch: int, ctx: int,
                 dtype_names: dict[str, str], heads: list[tuple[GGUFIndex, str]] | None = None,
                 caps: dict[str, int] | None = None) -> None:
    """Check every window of a placement against its device's memory (free now, and at most its
    --device-memory cap) before the pass starts, and the Score task's `heads` ((GGUFIndex, dtype
    name) of the model's own by default; with a KL base, both) on the last window's device."""
    import torch

    caps = caps or {}
    dtypes = {d: getattr(torch, name) for d, name in dtype_names.items()}
    usable = {}
    for device in {w.device for w in windows}:
        free = available_bytes(device)
        usable[device] = min(free, caps[device]) if device in caps else free
    for device in sorted(usable):
        per_layer, experts = layer_costs(gguf, n_layers, dtypes[device])
        check_windows_fit([w for w in windows if w.device == device], per_layer,
                          window_fixed_bytes(gguf, batch, ctx, n_head, device), dtype_names, usable, experts)
    last = windows[-1].device
    check_heads_fit(heads or [(gguf, dtype_names[last])], last, usable[last])


def heads_need(heads: list[tuple[GGUFIndex, str]]) -> tuple[int, int, list[str]]:
    """heads: (GGUFIndex, compute dtype name) of each -> (bytes the Score task needs, of them the
    heads' weights, the heads' tensor names)."""
    import torch

    from ..model.scoring import SCRATCH_BYTES

    names = ["output.weight" if "output.weight" in g.tensors else "token_embd.weight" for g, _ in heads]
    weights = sum(getattr(torch, dtype).itemsize * int(np.prod(g.tensors[n].shape))
                  for (g, dtype), n in zip(heads, names))
    return RUNTIME_BYTES + weights + SCRATCH_BYTES, weights, names


def check_heads_fit(heads: list[tuple[GGUFIndex, str]], device: str, available: int) -> None:
    """The Score task holds the dequantized LM head of each model it scores (two with a KL base,
    each in its run's compute dtype) and a block of logits (rows x a slice of the vocabulary) with
    their temporaries on the last window's device."""
    need, weights, names = heads_need(heads)
    if need > available:
        what = (f"the LM head ({names[0]}) on {device} needs" if len(heads) == 1
                else f"the LM heads of the model and its KL base on {device} need")
        dtypes = "/".join(sorted({dtype for _, dtype in heads}))
        advice = "; --compute-dtype bfloat16 halves it" if dtypes == "float32" else ""
        raise UserError(f"{what} about {need / GiB:.1f} GiB "
                        f"({weights / GiB:.1f} GiB of {dtypes} weights) but {available / GiB:.1f} GiB "
                        f"are available{advice}")


def check_disk(shape: tuple[int, int, int], boundary_dtype: str, alive: int, free: int | None, run_root: str,
               extra: int = 0) -> None:
    """Refuse a pass whose boundaries ([sequences, ctx, hidden], `alive` of them on disk at
    once), scores and `extra` bytes cannot fit the `free` bytes of the run root's disk (None:
    an object store)."""
    width = 4 if boundary_dtype == "float32" else 2
    need = alive * width * int(np.prod(shape)) + 8 * shape[0] * shape[1] + extra
    if free is not None and need > free:
        raise UserError(f"the pass needs about {need / GiB:.2f} GiB under {run_root} "
                        f"({alive} boundaries of {shape}) but {free / GiB:.2f} GiB are free")
