"""CUDA check, for a machine with a GPU (a few minutes; CI never runs it).

    python -m pipeline.gpu_check [--config configs/gpu_check.toml]

For each model: a float32 CPU pass, then on the GPU (`device` of the settings) a whole-trunk
pass and a cycled one in the configured compute dtype. Prints mean NLL, PPL, tokens/s, the
peak CUDA memory of each window task (torch.cuda.max_memory_allocated), and checks cycled
against whole and GPU against CPU (mean NLL within the configured tolerance). Exits 1 when a
check fails.
"""
import argparse
import json
import sys
import tempfile
import tomllib
from pathlib import Path

import luigi

from ..errors import UserError
from ..paths import CONFIGS, REPO_ROOT


def run(alias: str, cfg: dict, root: Path, **params) -> tuple[dict, list[dict]]:
    from ..flow.tasks import PerplexityRun

    result = root / "result.json"
    task = PerplexityRun(model=alias, task="wikitext-2", corpus=cfg["corpus"], ctx=cfg["ctx"], chunks=cfg["chunks"],
                         run_root=str(root), result_json=str(result), **params)
    if not luigi.build([task], local_scheduler=True, log_level="WARNING"):
        raise UserError(f"the pass {params} on {alias} failed")
    manifests = [json.loads(p.read_text()) for p in root.glob("LayerWindow/*/manifest.json")]
    return json.loads(result.read_text()), sorted(manifests, key=lambda m: m["identity"]["layers"])


def check_model(alias: str, cfg: dict) -> bool:
    rows, ok = [], True
    with tempfile.TemporaryDirectory(prefix="layercycle-gpu-check-") as tmp:
        cpu, _ = run(alias, cfg, Path(tmp) / "cpu", device="cpu", window_layers=0, compute_dtype="float32")
        gpu = {}
        for name, window in (("whole", 0), ("cycled", cfg["window_layers"])):
            gpu[name] = run(alias, cfg, Path(tmp) / name, device=cfg["device"], window_layers=window,
                            compute_dtype=cfg["compute_dtype"])
        rows.append(("cpu float32 whole", cpu, []))
        rows += [(f"{cfg['device']} {cfg['compute_dtype']} {name}", *gpu[name]) for name in ("whole", "cycled")]
    print(f"\n## {alias}\n")
    print("| run | mean NLL | PPL | tokens/s | peak CUDA MB per window |")
    print("|---|---|---|---|---|")
    for name, r, windows in rows:
        peaks = " ".join(f"{m['device_peak_mb']:.0f}" for m in windows if m["device_peak_mb"] is not None) or "-"
        print(f"| {name} | {r['mean_nll']:.6f} | {r['ppl']:.4f} | {r['tokens_per_s']:.1f} | {peaks} |")
    tol = cfg["mean_nll_rel_tol"]
    for label, a, b in (("cycled vs whole (GPU)", gpu["cycled"][0], gpu["whole"][0]),
                        ("GPU vs CPU", gpu["whole"][0], cpu)):
        rel = abs(a["mean_nll"] - b["mean_nll"]) / b["mean_nll"]
        passed = rel <= tol
        ok &= passed
        print(f"{label}: mean NLL differs by {100 * rel:.3f}% ({'ok' if passed else 'FAIL'}, limit {100 * tol:.1f}%)")
    return ok


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=CONFIGS / "gpu_check.toml")
    args = parser.parse_args(argv)
    try:
        import torch

        with open(args.config, "rb") as f:
            cfg = tomllib.load(f)
        device = cfg["device"]
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise UserError("no CUDA device: this check needs a GPU machine")
        cfg["corpus"] = str((REPO_ROOT / cfg["corpus"]).resolve())
        print(f"device: {torch.cuda.get_device_name(device) if device.startswith('cuda') else device}")
        ok = all([check_model(alias, cfg) for alias in cfg["models"]])
    except UserError as e:
        print(f"layercycle gpu_check: {e}", file=sys.stderr)
        return 1
    return 0 if ok else 1


