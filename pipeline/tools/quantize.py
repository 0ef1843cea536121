"""A base model and its quantizations, made as a user makes them: the base by the synthetic
writer in bfloat16 (random normal weights), each quantization by llama.cpp's llama-quantize
from that base, every file written once into data/models/ (never committed).

    python -m pipeline.tools.quantize --config configs/quantize/overnight-moe.toml

The settings name the set (`name`: files data/models/NAME-BF16.gguf and NAME-TYPE.gguf), the
types, the llama-cpp-python release whose llama.cpp builds llama-quantize, and the base's shape
as a [base] table of pipeline/tools/synthetic.py's Shape (its `quant` BF16).
"""
import argparse
import os
import sys
from pathlib import Path

from ..errors import UserError
from ..paths import MODELS_CACHE
from .settings import read_settings


def quantized_set(cfg: dict, folder: Path = MODELS_CACHE) -> list[Path]:
    """The base and each quantization of it, made where missing; the base first."""
    from ..gguf_io.registry import resolve_model
    from .llamacpp import llama_tool, run_checked
    from .synthetic import Shape, write_synthetic_gguf

    shape = dict(cfg["base"])
    tokenizer = resolve_model(shape.pop("tokenizer_from"))
    if Shape(**shape).quant != "BF16":
        raise UserError('the [base] of a quantized set is written in BF16 (quant = "BF16")')
    base = folder / f"{cfg['name']}-BF16.gguf"
    if not base.is_file():
        print(f"writing {base} ...", file=sys.stderr)
        folder.mkdir(parents=True, exist_ok=True)
        write_synthetic_gguf(base, Shape(**shape), tokenizer)
    made = [base]
    for qtype in cfg["types"]:
        path = folder / f"{cfg['name']}-{qtype}.gguf"
        if not path.is_file():
            binary = llama_tool(cfg["llama_cpp_python"], "llama-quantize")
            partial = path.with_name(path.name + ".partial")   # a killed quantization never looks finished
            print(f"writing {path} ...", file=sys.stderr)
            run_checked([str(binary), str(base), str(partial), qtype, str(os.cpu_count() or 2)],
                        f"quantize {base.name} to {qtype}")
            partial.rename(path)
        made.append(path)
    return made


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.tools.quantize", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        for path in quantized_set(read_settings(args.config)):
            print(f"{path}  {path.stat().st_size / 1e9:.2f} GB")
    except UserError as e:
        print(f"layercycle quantize: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
