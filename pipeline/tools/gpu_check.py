"""CUDA check, for a machine with a GPU (a few minutes; CI never runs it).

    python -m pipeline.gpu_check [--config configs/gpu_check.toml] [--matrix-only]

For each model of the settings (registered ones, and small synthetic ones written into
data/models/ on first use, so the GPU host needs neither a converter nor any network beyond the
registered models; between them every attention and FFN form computed: sliding windows, latent
attention, sinks, chunked attention past 8192 tokens, NoPE layers with the attention
temperature, DeepSeek and MiniMax Sparse Attention, Mamba2, Gated DeltaNet, Kimi Delta Attention,
Gemma 4's K/V carried across windows and per-layer inputs, routed and shared experts, expert
slices; a model's settings may set its own chunks, corpus and
mean_nll_rel_tol): a float32 CPU
pass, then in the configured compute dtype on the GPU a whole-trunk pass, a cycled one and a
split one (`--gpu-layers` from `--first-layer`, the other layers on the CPU). Then a
`--kl-base` pass of two models that share a tokenizer. Prints mean NLL, PPL, tokens/s, the
budget the windows were planned for and each window's peak CUDA memory (allocated /
reserved), and checks:

- cycled == whole on the GPU, every sequence's NLL bit for bit (a boundary holds the compute
  dtype's values exactly in float32);
- GPU and split vs CPU: mean NLL within the configured tolerance;
- where a model sets `sliced` (a `device_memory` below one layer, and a `compute_dtype`): the
  pass planned for that budget runs its layers in expert slices, and equals the whole-trunk
  pass in that dtype on the GPU, every sequence's NLL bit for bit;
- the KL pass's two perplexities equal the two models' own passes exactly;
- one case of every architecture (the settings' [matrix]): each member of the conformance matrix
  (pipeline/tools/architectures.py), its tiny model read from the settings' folder, which
  `python -m tests.hf_models FOLDER` writes on a machine with llama.cpp's converter (carry it to
  the GPU machine with the repository): a float32 pass on the CPU, then on the GPU in the
  [matrix] compute dtype (float32: each family's math on CUDA; the conformance test checks
  bfloat16 against the family's bound) a whole-trunk pass, one in 1-layer windows, a split one
  (`--gpu-layers 2 --first-layer 1`) and, for a family with routed experts that it slices, one
  with each such layer in two expert slices; 1-layer windows and slices equal the whole trunk
  every sequence's NLL bit for bit, the whole and split passes lie within `mean_nll_nats` of the
  CPU's mean NLL.

Exits 1 when a check fails.
"""
import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import luigi

from ..errors import UserError
from ..flow.entry import PerplexityRun
from ..paths import CONFIGS, REPO_ROOT
from ..run.placement import format_placement, parse_placement
from .architectures import MATRIX, Member, sliced_windows
from .synthetic import synthetic_or_registered


class PlacedRun(PerplexityRun):
    """A pass in the windows given (as a placement record writes them), not planned for a budget:
    the matrix's sliced case, every layer with routed experts in slices of a tiny model."""
    windows = luigi.Parameter()

    def placement(self, *args, **kwargs) -> list:
        return parse_placement(self.windows)


def run(model: Path, cfg: dict, ctx: int, root: Path, task=PerplexityRun, **params) -> tuple[dict, list[dict]]:
    """One pass: its result and the manifests of its window tasks, in layer order."""
    result = root / "result.json"
    params = {"device": cfg["device"], "compute_dtype": cfg["compute_dtype"], **params}
    task = task(model=str(model), task="wikitext-2", corpus=cfg["corpus"], ctx=ctx, chunks=cfg["chunks"],
                run_root=str(root), result_json=str(result), **params)
    with contextlib.redirect_stdout(io.StringIO()):     # each pass's report: its figures are in the tables
        built = luigi.build([task], local_scheduler=True, log_level="WARNING")
    if not built:
        raise UserError(f"the pass {params} on {model.name} failed")
    manifests = [json.loads(p.read_text()) for p in root.glob("LayerWindow/*/manifest.json")]
    return json.loads(result.read_text()), sorted(manifests, key=lambda m: m["identity"]["layers"])


def peaks(windows: list[dict]) -> str:
    """'allocated/reserved' MB of each window task on CUDA, '-' where none ran there."""
    cells = [f"{m['device_peak_mb']:.0f}/{m.get('device_reserved_mb') or 0:.0f}"
             for m in windows if m.get("device_peak_mb") is not None]
    return " ".join(cells) or "-"


def budget_mb(cfg: dict, params: dict) -> str:
    """The budget a pass's windows on its device were planned for: its --device-memory, else
    the device's share of its memory."""
    from ..run.preflight import device_budget, parse_size

    cap = params.get("device_memory")
    return f"{device_budget(params.get('device', cfg['device']), cap and parse_size(cap)) / 2**20:.0f}"


def check(label: str, passed: bool, detail: str) -> bool:
    print(f"{label}: {detail} ({'ok' if passed else 'FAIL'})")
    return passed


def close(label: str, a: dict, b: dict, tol: float) -> bool:
    rel = abs(a["mean_nll"] - b["mean_nll"]) / b["mean_nll"]
    return check(label, rel <= tol, f"mean NLL differs by {100 * rel:.3f}%, limit {100 * tol:.1f}%")


def check_model(alias: str, cfg: dict) -> tuple[bool, dict]:
    """The model's passes and checks; returns whether they hold and its GPU whole-trunk result."""
    from ..gguf_io.reader import open_gguf
    from ..model.arch import load_architecture

    model = synthetic_or_registered(alias, cfg.get("synthetic", {}))
    own = cfg["models"][alias]
    ctx = own.get("ctx", 512)
    cfg = cfg | {k: own[k] for k in ("chunks", "corpus", "mean_nll_rel_tol") if k in own}
    n_layers = load_architecture(open_gguf(str(model))).hp.n_layers
    dev, dtype = cfg["device"], cfg["compute_dtype"]
    with tempfile.TemporaryDirectory(prefix="layercycle-gpu-check-") as tmp:
        root = Path(tmp)
        plans = {
            "cpu float32 whole": dict(device="cpu", window_layers=0, compute_dtype="float32"),
            f"{dev} {dtype} whole": dict(window_layers=0),
            f"{dev} {dtype} cycled": dict(window_layers=cfg["window_layers"]),
            f"{dev} {dtype} split": dict(window_layers=cfg["window_layers"], gpu_layers=n_layers // 2,
                                         first_layer=n_layers // 4),
        }
        sliced = own.get("sliced")
        if sliced:
            held = sliced["compute_dtype"]
            plans |= {f"{dev} {held} experts held": dict(window_layers=0, compute_dtype=held),
                      f"{dev} {held} in {sliced['device_memory']}": dict(compute_dtype=held,
                                                                          device_memory=sliced["device_memory"])}
        passes = {name: run(model, cfg, ctx, root / f"pass-{k}", **params)
                  for k, (name, params) in enumerate(plans.items())}
    print(f"\n## {alias} (ctx {ctx})\n")
    print("| run | placement | mean NLL | PPL | tokens/s | budget MB | peak CUDA MB per window (allocated/reserved) |")
    print("|---|---|---|---|---|---|---|")
    for name, (r, windows) in passes.items():
        print(f"| {name} | {r['placement_text']} | {r['mean_nll']:.6f} | {r['ppl']:.4f} | {r['tokens_per_s']:.1f} "
              f"| {budget_mb(cfg, plans[name])} | {peaks(windows)} |")
    cpu, whole, cycled, split = (r for r, _ in list(passes.values())[:4])
    ok = identical("cycled vs whole (GPU)", cycled, whole)
    ok &= close("GPU vs CPU", whole, cpu, cfg["mean_nll_rel_tol"])
    ok &= close("split vs CPU", split, cpu, cfg["mean_nll_rel_tol"])
    if sliced:
        (held, _), (in_slices, _) = list(passes.values())[4:]
        ok &= check("expert slices planned", "expert slices" in in_slices["placement_text"],
                    f"{sliced['device_memory']}: {in_slices['placement_text']}")
        ok &= identical("sliced vs held (GPU)", in_slices, held)
    return ok, whole


def identical(label: str, a: dict, b: dict) -> bool:
    same = same_sequences(a, b)
    return check(label, same, "every sequence's NLL identical" if same else "sequences differ")


def member_path(m: Member, folder: Path) -> Path:
    path = folder / f"{m.name}.gguf"
    if not path.is_file():
        raise UserError(f"{path} is missing: `python -m tests.hf_models {folder}` writes the matrix's models "
                        "(on a machine with llama.cpp's converter; carry the folder to this one)")
    return path


def check_member(m: Member, cfg: dict) -> bool:
    """One member of the conformance matrix in the [matrix] settings' dtype: its passes on the
    device against each other (bit for bit) and against a float32 pass on the CPU (within the
    settings' nats); one table row."""
    from ..gguf_io.reader import open_gguf
    from ..model.arch import load_architecture

    own = cfg["matrix"]
    model = member_path(m, REPO_ROOT / own["folder"])
    gguf = open_gguf(str(model))
    dev, dtype, tol = cfg["device"], own["compute_dtype"], own["mean_nll_nats"]
    cfg = cfg | {"chunks": own["chunks"], "compute_dtype": dtype}
    plans = {"cpu": dict(device="cpu", window_layers=0, compute_dtype="float32"), "whole": dict(window_layers=0),
             "cycled": dict(window_layers=1), "split": dict(window_layers=1, gpu_layers=2, first_layer=1)}
    if m.experts and load_architecture(gguf).sliceable_experts:
        plans["sliced"] = dict(task=PlacedRun, windows=format_placement(sliced_windows(gguf, dev)))
    with tempfile.TemporaryDirectory(prefix="layercycle-gpu-check-") as tmp:
        r = {name: run(model, cfg, m.ctx, Path(tmp) / name, sequences_per_chunk=own["sequences_per_chunk"],
                       **params)[0] for name, params in plans.items()}
    same = {name: same_sequences(r[name], r["whole"]) for name in ("cycled", "sliced") if name in r}
    off = {name: abs(r[name]["mean_nll"] - r["cpu"]["mean_nll"]) for name in ("whole", "split")}
    ok = all(same.values()) and max(off.values()) <= tol
    cells = [f"{r[n]['mean_nll']:.6f}" if n in r else "-" for n in ("cpu", "whole", "cycled", "split", "sliced")]
    verdict = ", ".join([f"{name} == whole" if same[name] else f"{name} != whole" for name in same] +
                        [f"{name} {off[name]:.2e} nats from the CPU's" for name in off])
    print(f"| {m.name} | {m.architecture} | {dev} {dtype} | {' | '.join(cells)} | {verdict} | "
          f"{'ok' if ok else 'FAIL'} |")
    return ok


def check_matrix(cfg: dict) -> list[tuple[str, bool, float]]:
    """Every member of the conformance matrix: a table row each, and its summary line."""
    print("\n## The conformance matrix's members\n")
    print("| member | architecture | device | cpu float32 whole | whole | 1-layer windows | split | "
          "expert slices | checks | |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    summary = []
    for m in MATRIX:
        started = time.perf_counter()
        summary.append((f"matrix {m.name}", check_member(m, cfg), time.perf_counter() - started))
    return summary


def same_sequences(a: dict, b: dict) -> bool:
    return [w["mean_nll"] for w in a["per_window"]] == [w["mean_nll"] for w in b["per_window"]]


def check_kl(cfg: dict, own: dict[str, dict]) -> bool:
    """A --kl-base pass on the GPU: both models' heads in one Score task; each side's PPL must
    be its own pass's, exactly (kld.py: each softmax is the one a run of its own computes)."""
    alias, base = cfg["kl"]
    models = {a: synthetic_or_registered(a, cfg.get("synthetic", {})) for a in (alias, base)}
    ctx = cfg["models"][alias].get("ctx", 512)
    with tempfile.TemporaryDirectory(prefix="layercycle-gpu-check-") as tmp:
        r, _ = run(models[alias], cfg, ctx, Path(tmp), window_layers=0, kl_base=str(models[base]))
    kld = r["kld"]
    print(f"\n## {alias} against the KL base {base}\n")
    print(f"mean KLD {kld['mean']:.6f}, same top {100 * kld['same_top']:.2f}%, PPL {kld['ppl']:.4f}, "
          f"base PPL {kld['ppl_base']:.4f}")
    return check("KL pass vs own passes", kld["ppl"] == own[alias]["ppl"] and kld["ppl_base"] == own[base]["ppl"],
                 f"PPL {kld['ppl']!r} / {own[alias]['ppl']!r}, base {kld['ppl_base']!r} / {own[base]['ppl']!r}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=CONFIGS / "gpu_check.toml")
    parser.add_argument("--matrix-only", action="store_true",
                        help="only the conformance matrix's members (on a machine without the registered models)")
    args = parser.parse_args(argv)
    try:
        import torch

        with open(args.config, "rb") as f:
            cfg = tomllib.load(f)
        if args.matrix_only:
            cfg = {k: v for k, v in cfg.items() if k not in ("models", "kl")}
        device = cfg["device"]
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise UserError("no CUDA device: this check needs a GPU machine")
        for settings in (cfg, *cfg.get("models", {}).values()):
            if "corpus" in settings:
                settings["corpus"] = str((REPO_ROOT / settings["corpus"]).resolve())
        print(f"device: {torch.cuda.get_device_name(device) if device.startswith('cuda') else device}")
        ok = check_all(cfg)
    except UserError as e:
        print(f"layercycle gpu_check: {e}", file=sys.stderr)
        return 1
    return 0 if ok else 1


def check_all(cfg: dict) -> bool:
    """Every model's checks, then the KL pass; a summary line per case at the end."""
    summary, own = [], {}
    for alias in cfg.get("models", {}):
        started = time.perf_counter()
        passed, own[alias] = check_model(alias, cfg)
        summary.append((alias, passed, time.perf_counter() - started))
    if cfg.get("kl"):
        started = time.perf_counter()
        summary.append(("KL " + " vs ".join(cfg["kl"]), check_kl(cfg, own), time.perf_counter() - started))
    if cfg.get("matrix"):
        summary += check_matrix(cfg)
    print("\n## Summary\n")
    for case, passed, seconds in summary:
        print(f"{case}: {'ok' if passed else 'FAIL'} ({seconds:.0f} s)")
    return all(passed for _, passed, _ in summary)
