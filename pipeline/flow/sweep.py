"""A sweep: a grid of models x context lengths x methods x placements over one evaluation task,
each grid point an ordinary run (finished ones reused, shared tokenization done once), then one
table (CSV and Markdown) and plots (PPL and KLD against file size).

    luigi --module pipeline Sweep --config configs/sweeps/NAME.toml
"""
import csv
import itertools
import tomllib
from pathlib import Path

import numpy as np

from ..errors import UserError
from ..paths import REPO_ROOT, RUNS

GRID_KEYS = ("models", "ctx", "method", "window_layers")
RUN_KEYS = ("task", "corpus", "chunks", "compute_dtype", "boundary_dtype", "kl_base", "windows_per_chunk")
COLUMNS = ("model", "file_gb", "bits_per_weight", "ctx", "method", "placement", "ppl", "ppl_stderr", "mean_nll",
           "kld_mean", "kld_p99", "same_top", "ppl_ratio", "elapsed_s")


def load_sweep(path: str) -> dict:
    """The sweep file, with its grid axes as lists and paths resolved from the repository root."""
    try:
        with open(path, "rb") as f:
            cfg = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise UserError(f"cannot read sweep file {path}: {e}") from None
    unknown = set(cfg) - set(GRID_KEYS) - set(RUN_KEYS) - {"name", "out"}
    if unknown or "models" not in cfg:
        raise UserError(f"{path}: {'unknown keys ' + ', '.join(sorted(unknown)) if unknown else 'no models'}")
    for key in GRID_KEYS:
        value = cfg.get(key, [])
        cfg[key] = value if isinstance(value, list) else [value]
    if cfg.get("corpus"):
        cfg["corpus"] = str((REPO_ROOT / cfg["corpus"]).resolve())
    cfg["models"] = [m if not (REPO_ROOT / m).is_file() else str((REPO_ROOT / m).resolve()) for m in cfg["models"]]
    cfg["out"] = REPO_ROOT / cfg.get("out", RUNS / "sweeps" / cfg.get("name", Path(path).stem))
    return cfg


def grid(cfg: dict) -> list[dict]:
    """PerplexityRun parameters of every grid point; an empty axis keeps the run's default."""
    common = {k: cfg[k] for k in RUN_KEYS if k in cfg}
    axes = [[(key.rstrip("s") if key == "models" else key, v) for v in cfg[key]] or [None] for key in GRID_KEYS]
    return [{**common, **dict(p for p in point if p)} for point in itertools.product(*axes)]


def model_size(gguf) -> tuple[float, float]:
    """File size in GB and bits per weight (file bits over the weights' elements)."""
    elements = sum(int(np.prod(t.shape)) for t in gguf.tensors.values())
    size = gguf.path.stat().st_size
    return size / 1e9, 8 * size / elements


def table_row(result: dict, gguf) -> dict:
    file_gb, bpw = model_size(gguf)
    k = result.get("kld", {})
    return {"model": Path(result["model"]["path"]).name, "file_gb": round(file_gb, 4), "bits_per_weight": round(bpw, 3),
            "ctx": result["ctx"], "method": result["method"], "placement": result["placement_text"],
            "ppl": result["ppl"], "ppl_stderr": result["ppl_stderr"], "mean_nll": result["mean_nll"],
            "kld_mean": k.get("mean"), "kld_p99": k.get("p99"), "same_top": k.get("same_top"),
            "ppl_ratio": k.get("ppl_ratio"), "elapsed_s": round(result["elapsed_s"], 1)}


def write_tables(rows: list[dict], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "sweep.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    shown = [c for c in COLUMNS if any(r[c] is not None for r in rows)]
    cell = lambda v: "-" if v is None else f"{v:.4f}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(shown) + " |", "|" + "---|" * len(shown)]
    lines += ["| " + " | ".join(cell(r[c]) for c in shown) + " |" for r in rows]
    (out / "sweep.md").write_text("\n".join(lines) + "\n")


def write_plots(rows: list[dict], out: Path) -> list[Path]:
    """PPL vs file size, and KLD vs file size where a base is set; one series per ctx/method/placement."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("the sweep's plots need matplotlib: pip install -e '.[plot]'") from None
    written = []
    for column, label, name in (("ppl", "PPL", "ppl_vs_size.png"), ("kld_mean", "mean KLD", "kld_vs_size.png")):
        points = [r for r in rows if r[column] is not None]
        if not points:
            continue
        fig, ax = plt.subplots(figsize=(7, 4.5))
        key = lambda r: (r["ctx"], r["method"], r["placement"])  # noqa: E731
        for series, group in itertools.groupby(sorted(points, key=key), key=key):
            group = sorted(group, key=lambda r: r["file_gb"])
            ax.plot([r["file_gb"] for r in group], [r[column] for r in group], marker="o",
                    label=f"ctx {series[0]}, {series[1]}")
            for r in group:
                ax.annotate(r["model"], (r["file_gb"], r[column]), fontsize=7)
        ax.set(xlabel="file size (GB)", ylabel=label, title=f"{label} vs file size")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / name, dpi=100)
        plt.close(fig)
        written.append(out / name)
    return written
