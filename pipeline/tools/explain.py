"""What layercycle computes for a model file or an architecture, read off the code that runs.

    python -m pipeline.tools.explain FILE_OR_ARCH [--compute-dtype float32|bfloat16|float16]

For an architecture (a `general.architecture` value, such as qwen3moe): the family that computes
it, the code that reads a layer's tensors and the layer's graph (its forward), the tensors held
in float32 whatever the compute dtype, and the settings it computes beyond those every family
reads. For a GGUF file (or a registered model alias) the same, then one layer of each kind with
its blocks, their settings and the shapes and dtypes of the tensors a window holds, built on
torch's meta device: no weight is read.
"""
import argparse
import inspect
import sys
from pathlib import Path

import torch

from ..errors import UserError
from ..model.arch import ARCHITECTURES
from ..model.arch.family import DecoderArch
from ..model.arch.modules import Layer


def layer_classes(family: type[DecoderArch]) -> list[type[Layer]]:
    """The Layer classes the family's `layer` builds, found among the names its code reads (a module's
    or the family's own: `layer_module`)."""
    method = family.layer
    found = [method.__globals__.get(n, getattr(family, n, None)) for n in method.__code__.co_names]
    return [c for c in found if isinstance(c, type) and issubclass(c, Layer)]


def where(obj) -> str:
    path = Path(inspect.getsourcefile(obj))
    return str(path.relative_to(path.parents[3])) if len(path.parents) > 3 else str(path)


def describe_family(arch: str, family: type[DecoderArch]) -> list[str]:
    method = family.layer
    owner = next(c for c in family.__mro__ if "layer" in c.__dict__)
    lines = [f"{arch}: computed by {family.__name__} ({where(family)})", ""]
    doc = inspect.getmodule(family).__doc__
    if doc:
        lines += [doc.strip(), ""]
    lines += [f"A layer's tensors ({owner.__name__}.layer, {where(owner)}):", "",
              inspect.getsource(method).rstrip(), ""]
    for cls in layer_classes(family):
        lines += [f"Its graph ({cls.__name__}.forward, {where(cls)}):", "", inspect.getsource(cls.forward).rstrip(), ""]
    lines.append("Held in float32 whatever the compute dtype: tensors ending " + ", ".join(family.float32_tensors))
    if family.honours:
        lines.append("Settings computed beyond those every family reads: " + ", ".join(
            sorted(key.format(arch=arch) for key in family.honours)))
    return lines


def layer_kinds(model: DecoderArch) -> dict[tuple, list[int]]:
    """The layers of each kind: the same mixer, feed-forward block and attention settings."""
    kinds: dict[tuple, list[int]] = {}
    for spec in model.specs:
        kinds.setdefault((spec.mixer, spec.ffn, spec.attention), []).append(spec.index)
    return kinds


def ranges(indices: list[int]) -> str:
    runs, start = [], indices[0]
    for a, b in zip(indices, indices[1:] + [None]):
        if b != a + 1:
            runs.append(str(start) if start == a else f"{start}-{a}")
            start = b
    return ", ".join(runs)


def describe_file(path: str, dtype: torch.dtype) -> list[str]:
    from ..gguf_io.reader import open_gguf
    from ..model.arch import load_architecture

    gguf = open_gguf(path)
    model = load_architecture(gguf)
    hp = model.hp
    lines = describe_family(gguf.architecture, type(model))
    lines += ["", f"{gguf.path}: {hp.n_layers} layers, hidden {hp.hidden}, vocabulary {hp.vocab}, "
              f"context {hp.context_length}, RMS eps {hp.eps:g}; tensors as held for {str(dtype)[6:]} compute", ""]
    for kind, indices in layer_kinds(model).items():
        lines += [f"Layers {ranges(indices)}:", str(model.layer_shapes(indices[0], dtype)), ""]
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.tools.explain", description=__doc__.split("\n\n")[0])
    parser.add_argument("model", metavar="FILE_OR_ARCH",
                        help="a GGUF file, a registered model alias or an architecture")
    parser.add_argument("--compute-dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    args = parser.parse_args(argv)
    try:
        if args.model in ARCHITECTURES and not Path(args.model).exists():
            lines = describe_family(args.model, ARCHITECTURES[args.model])
        else:
            from ..gguf_io.registry import resolve_model

            lines = describe_file(str(resolve_model(args.model)), getattr(torch, args.compute_dtype))
    except UserError as e:
        print(f"ERROR: layercycle: {e}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
