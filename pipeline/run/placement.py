"""Layer placement: contiguous windows that tile the trunk [0, L), each with a device."""
import math
from dataclasses import dataclass
from itertools import groupby

from ..errors import UserError
from . import cuda_probe


@dataclass(frozen=True)
class Window:
    device: str
    first: int
    last: int
    expert_slices: int = 1   # > 1: a layer larger than its device, its routed experts read in slices


def resolve_device(device: str) -> str:
    """The device a placement names: CUDA's presence is asked in a child process (cuda_probe),
    never of torch.cuda here, so that a process that forks task workers keeps CUDA usable for them."""
    if device not in ("cpu", "cuda", "auto"):
        raise UserError(f"unknown device {device!r} (cpu, cuda or auto)")
    if device == "cpu":
        return device
    why = cuda_probe.absent()
    if device == "auto":
        return "cpu" if why else "cuda"
    if why:
        raise UserError(f"--device cuda was asked for but no CUDA device is available ({why}); "
                        f"use --device cpu or auto")
    return device


def _split(first: int, last: int, size: int, device: str) -> list[Window]:
    size = size if size > 0 else last - first
    return [Window(device, a, min(a + size, last)) for a in range(first, last, size)]


def parse_window_layers(value) -> int | None:
    """--window-layers: a layer count (0: the whole trunk at once), or `auto` (None)."""
    if str(value).strip().lower() == "auto":
        return None
    try:
        size = int(value)
    except ValueError:
        raise UserError(f"--window-layers must be a number of layers or auto, got {value!r}") from None
    if size < 0:
        raise UserError(f"--window-layers must be >= 0, got {size}")
    return size


def pack_windows(per_layer: list[int], fixed: int, budget: int, first: int, last: int, device: str,
                 what: str = "the budget", experts: list[tuple[int, int]] | None = None,
                 floor: int = 0) -> list[Window]:
    """Layers [first, last) in the fewest windows whose weights plus `fixed` fit `budget`, each
    as long as it can be from where the last one ended. per_layer: weight bytes of each layer;
    experts: (bytes, count) of each layer's routed experts. A layer that cannot fit on its own
    is a window of its own whose experts run in the fewest slices that fit. `floor`: what the
    device needs besides the windows (the Score task), so a refusal names a budget that runs."""
    windows, start, held = [], first, 0
    for i in range(first, last):
        if per_layer[i] + fixed > budget:
            if held:
                windows.append(Window(device, start, i))
            windows.append(Window(device, i, i + 1, expert_slices(per_layer[i], fixed, budget, i, device, what,
                                                                  experts[i] if experts else (0, 0), floor)))
            start, held = i + 1, 0
            continue
        if held and held + per_layer[i] + fixed > budget:
            windows.append(Window(device, start, i))
            start, held = i, 0
        held += per_layer[i]
    return windows + ([Window(device, start, last)] if start < last else [])


def expert_slices(layer: int, fixed: int, budget: int, i: int, device: str, what: str,
                  experts: tuple[int, int], floor: int = 0) -> int:
    """The fewest slices layer i's routed experts run in so that the layer fits `budget`: its
    other weights, one slice of experts and `fixed`. Refused where one expert does not fit,
    naming the smallest budget that runs (at least `floor`)."""
    expert_bytes, n = experts
    rest, per_expert = layer - expert_bytes, expert_bytes / n if n else 0
    room = budget - fixed - rest
    if not n or room < per_expert:
        layer_need = fixed + rest + (per_expert if n else expert_bytes)
        smallest = f"; the smallest budget that works is {math.ceil(max(layer_need, floor) / 2**20)} MiB" + (
            ", what the Score task (the LM head and its scratch) holds" if floor > layer_need else "")
        raise UserError(f"layer {i} on {device} needs about {size_text(layer + fixed)} "
                        f"({size_text(layer)} of weights) but {what} is {size_text(budget)}"
                        + (f", and one of its {n} experts at a time does not fit either" if n else "") + smallest)
    return math.ceil(n / math.floor(room / per_expert))


def size_text(n: int) -> str:
    """Bytes as a refusal shows them: GiB to one decimal, MiB below a tenth of a GiB (where GiB
    would read 0.0)."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 / 10 else f"{n / 2**20:.1f} MiB"


def window_bytes(per_layer: list[int], experts: list[tuple[int, int]], w: Window) -> int:
    """Weight bytes a window holds at once: one slice of a sliced layer's experts."""
    held = sum(per_layer[w.first:w.last])
    if w.expert_slices == 1:
        return held
    expert_bytes, n = experts[w.first]
    return held - expert_bytes + math.ceil(n / w.expert_slices) * expert_bytes // n


def plan_placement(n_layers: int, window_layers: int | None, gpu_layers: int, first_layer: int,
                   device: str, pack=None, cycle: bool = False) -> list[Window]:
    """`--window-layers N` cycles N-layer windows over the placed layers on `device` (0: one
    window); None (auto) has `pack(device, first, last)` size them to the device's budget.
    `--gpu-layers N [--first-layer K]` puts [K, K+N) on `device` and the layers before and after
    on the CPU, packed to the CPU's budget (one window each where no `pack` is given).
    `--gpu-layers N --cycle` slides a window of N layers on `device` across the whole trunk."""
    if cycle:
        window_layers, gpu_layers = cycled_window(window_layers, gpu_layers, first_layer)

    def placed(first: int, last: int) -> list[Window]:
        return pack(device, first, last) if window_layers is None else _split(first, last, window_layers, device)

    def on_cpu(first: int, last: int) -> list[Window]:
        if first == last:
            return []
        return pack("cpu", first, last) if pack is not None else [Window("cpu", first, last)]

    if gpu_layers < 0:
        return placed(0, n_layers)
    if first_layer < 0 or gpu_layers == 0 or first_layer + gpu_layers > n_layers:
        raise UserError(f"--gpu-layers {gpu_layers} --first-layer {first_layer} does not fit "
                        f"the model's {n_layers} layers")
    end = first_layer + gpu_layers
    return on_cpu(0, first_layer) + placed(first_layer, end) + on_cpu(end, n_layers)


def cycled_window(window_layers: int | None, gpu_layers: int, first_layer: int) -> tuple[int | None, int]:
    """--cycle as (window layers, gpu layers) of the whole trunk on the device: `--gpu-layers N
    --cycle` is `--window-layers N`; without --gpu-layers, the windows --window-layers sets."""
    if first_layer:
        raise UserError(f"--cycle slides the device window across the whole trunk; --first-layer {first_layer} "
                        f"fixes where it stands: give one of them")
    if gpu_layers < 0:
        return window_layers, -1
    if gpu_layers == 0:
        raise UserError("--gpu-layers 0 --cycle slides a window of no layers: give --gpu-layers N >= 1")
    if window_layers is not None and window_layers != gpu_layers:
        raise UserError(f"--gpu-layers {gpu_layers} --cycle slides windows of {gpu_layers} layers; "
                        f"--window-layers {window_layers} asks for another size: give one of them")
    return gpu_layers, -1


def check_tiling(windows: list[Window], n_layers: int) -> None:
    edges = [0] + [w.last for w in windows]
    if [w.first for w in windows] != edges[:-1] or edges[-1] != n_layers or any(w.first >= w.last for w in windows):
        raise UserError(f"layer windows {describe(windows)} do not tile the trunk [0, {n_layers})")


def describe(windows: list[Window]) -> str:
    """e.g. 'cuda [0..8) [8..16), cpu [16..30)'; a window in expert slices: '[3..4) in 4 expert slices'."""
    def one(w: Window) -> str:
        return f"[{w.first}..{w.last})" + (f" in {w.expert_slices} expert slices" if w.expert_slices > 1 else "")
    return ", ".join(f"{dev} " + " ".join(one(w) for w in group)
                     for dev, group in ((d, list(g)) for d, g in groupby(windows, key=lambda w: w.device)))


def format_placement(windows: list[Window]) -> str:
    """The form a Luigi parameter carries: 'cpu:0:4,cpu:4:5:3' (a fourth field: expert slices)."""
    return ",".join(f"{w.device}:{w.first}:{w.last}" + (f":{w.expert_slices}" if w.expert_slices > 1 else "")
                    for w in windows)


def parse_placement(text: str) -> list[Window]:
    windows = []
    for part in text.split(","):
        device, first, last, *slices = part.split(":")
        windows.append(Window(device, int(first), int(last), int(slices[0]) if slices else 1))
    return windows
