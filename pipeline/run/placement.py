"""Layer placement: contiguous windows that tile the trunk [0, L), each with a device."""
from dataclasses import dataclass
from itertools import groupby

from ..errors import UserError


@dataclass(frozen=True)
class Window:
    device: str
    first: int
    last: int


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was asked for but no CUDA device is available (use --device cpu or auto)")
    if device not in ("cpu", "cuda"):
        raise UserError(f"unknown device {device!r} (cpu, cuda or auto)")
    return device


def _split(first: int, last: int, size: int, device: str) -> list[Window]:
    size = size if size > 0 else last - first
    return [Window(device, a, min(a + size, last)) for a in range(first, last, size)]


def plan_placement(n_layers: int, window_layers: int, gpu_layers: int, first_layer: int,
                   device: str) -> list[Window]:
    """`--window-layers N` cycles N-layer windows over the trunk on `device` (0: one window);
    `--gpu-layers N [--first-layer K]` puts [K, K+N) on `device` in N-layer windows (or
    `--window-layers` ones) and the layers before and after on the CPU, one window each."""
    if window_layers < 0:
        raise UserError(f"--window-layers must be >= 0, got {window_layers}")
    if gpu_layers < 0:
        return _split(0, n_layers, window_layers, device)
    if first_layer < 0 or gpu_layers == 0 or first_layer + gpu_layers > n_layers:
        raise UserError(f"--gpu-layers {gpu_layers} --first-layer {first_layer} does not fit "
                        f"the model's {n_layers} layers")
    end = first_layer + gpu_layers
    return ([Window("cpu", 0, first_layer)] if first_layer else []) + \
        _split(first_layer, end, window_layers, device) + \
        ([Window("cpu", end, n_layers)] if end < n_layers else [])


def check_tiling(windows: list[Window], n_layers: int) -> None:
    edges = [0] + [w.last for w in windows]
    if [w.first for w in windows] != edges[:-1] or edges[-1] != n_layers or any(w.first >= w.last for w in windows):
        raise UserError(f"layer windows {describe(windows)} do not tile the trunk [0, {n_layers})")


def describe(windows: list[Window]) -> str:
    """e.g. 'cuda [0..8) [8..16), cpu [16..30)'."""
    return ", ".join(f"{dev} " + " ".join(f"[{w.first}..{w.last})" for w in group)
                     for dev, group in ((d, list(g)) for d, g in groupby(windows, key=lambda w: w.device)))


def format_placement(windows: list[Window]) -> str:
    """The form a Luigi parameter carries: 'cpu:0:4,cpu:4:8'."""
    return ",".join(f"{w.device}:{w.first}:{w.last}" for w in windows)


def parse_placement(text: str) -> list[Window]:
    windows = []
    for part in text.split(","):
        device, first, last = part.split(":")
        windows.append(Window(device, int(first), int(last)))
    return windows
