"""A sweep: a grid of models x context lengths x methods x placements over one evaluation task,
each grid point an ordinary run (finished ones reused, shared tokenization done once), then one
table (CSV and Markdown) and plots (PPL and KLD against file size). A point that is refused
(a bad file, an unsupported family, a budget too small) is a row with its reason; the others
are computed.

    luigi --module pipeline Sweep --config configs/sweeps/NAME.toml
"""
import csv
import hashlib
import itertools
import json
import tomllib
from pathlib import Path

import numpy as np

from ..errors import UserError
from ..paths import REPO_ROOT, RUNS, location
from ..store import outputs

# every key but `models` takes one value or a list (a grid axis); a single run's options, less
# where its result goes
KEYS = ("models", "ctx", "method", "window_layers", "gpu_layers", "first_layer", "device", "device_memory",
        "compute_dtype", "boundary_dtype", "shards", "task", "corpus", "tokens_file", "chunks", "stride",
        "unscored_prefix", "bos", "kl_base", "sequences_per_chunk", "windows_per_chunk", "hellaswag",
        "hellaswag_tasks", "winogrande", "winogrande_tasks", "multiple_choice", "multiple_choice_tasks")
# paths relative to the repository root
FILE_KEYS = ("corpus", "tokens_file", "hellaswag", "winogrande", "multiple_choice")
COLUMNS = ("model", "status", "file_gb", "bits_per_weight", "ctx", "method", "placement", "ppl", "ppl_stderr",
           "mean_nll", "accuracy", "kld_mean", "kld_p99", "same_top", "ppl_ratio", "elapsed_s", "tokens_per_s",
           "reason")


def load_sweep(path: str) -> dict:
    """The sweep file, with its grid axes as lists and paths resolved from the repository root."""
    try:
        with open(path, "rb") as f:
            cfg = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise UserError(f"cannot read sweep file {path}: {e}") from None
    unknown = set(cfg) - set(KEYS) - {"name", "out"}
    if unknown or "models" not in cfg:
        raise UserError(f"{path}: {'unknown keys ' + ', '.join(sorted(unknown)) if unknown else 'no models'}")
    for key in KEYS:
        value = cfg.get(key, [])
        cfg[key] = value if isinstance(value, list) else [value]
    for key in FILE_KEYS:
        cfg[key] = [str((REPO_ROOT / v).resolve()) if v else v for v in cfg[key]]
    cfg["models"] = [m if not (REPO_ROOT / m).is_file() else str((REPO_ROOT / m).resolve()) for m in cfg["models"]]
    if cfg["kl_base"]:
        cfg["kl_base"] = [m if not (REPO_ROOT / m).is_file() else str((REPO_ROOT / m).resolve())
                          for m in cfg["kl_base"]]
    cfg["out"] = REPO_ROOT / cfg.get("out", RUNS / "sweeps" / cfg.get("name", Path(path).stem))
    return cfg


def grid(cfg: dict) -> list[dict]:
    """PerplexityRun parameters of every grid point; an absent key keeps the run's default."""
    axes = [[("model" if key == "models" else key, v) for v in cfg[key]] or [None] for key in KEYS]
    return [dict(p for p in point if p) for point in itertools.product(*axes)]


def parse_point(task_class, params: dict) -> dict:
    """A grid point's values as its run takes them: each read by its parameter as if typed on
    the command line, so a value of the wrong kind (`ctx = "abc"`) is refused naming its key."""
    kinds = dict(task_class.get_params())
    parsed = {}
    for key, value in params.items():
        try:
            parsed[key] = kinds[key].normalize(kinds[key].parse(value if isinstance(value, str) else str(value)))
        except ValueError as e:
            raise UserError(f"{key} = {value!r}: {e}") from None
    return parsed


def model_size(gguf) -> tuple[float, float]:
    """File size in GB and bits per weight (file bits over the weights' elements)."""
    elements = sum(int(np.prod(t.shape)) for t in gguf.tensors.values())
    size = gguf.n_bytes
    return size / 1e9, 8 * size / elements


def table_row(result: dict, gguf) -> dict:
    file_gb, bpw = model_size(gguf)
    k = result.get("kld", {})
    return {"model": Path(result["model"]["path"]).name, "status": "ok", "file_gb": round(file_gb, 4),
            "bits_per_weight": round(bpw, 3), "ctx": result["ctx"], "method": result["method"],
            "placement": result["placement_text"], "ppl": result.get("ppl"), "ppl_stderr": result.get("ppl_stderr"),
            "mean_nll": result.get("mean_nll"), "accuracy": result.get(result["method"], {}).get("accuracy"),
            "kld_mean": k.get("mean"), "kld_p99": k.get("p99"),
            "same_top": k.get("same_top"), "ppl_ratio": k.get("ppl_ratio"), "elapsed_s": round(result["elapsed_s"], 1),
            "tokens_per_s": result["tokens_per_s"] and round(result["tokens_per_s"], 1), "reason": None}


def refused_row(params: dict, reason: str) -> dict:
    """The row of a grid point that was refused: what the sweep file set, and why."""
    row = dict.fromkeys(COLUMNS)
    return row | {"model": Path(params["model"]).name, "status": "refused", "ctx": params.get("ctx"),
                  "method": params.get("method"), "reason": reason}


def write_tables(rows: list[dict], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "sweep.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    shown = [c for c in COLUMNS if any(r[c] is not None for r in rows)]
    cell = lambda v: "-" if v is None else f"{v:.4f}" if isinstance(v, float) else str(v).replace("|", "\\|")  # noqa: E731
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


def progress_path(run_root, config: str):
    """Where a sweep records its runs, for every process that shares the run root: each run's
    Score outputs and the outputs of its own chain, as paths under the run root."""
    digest = hashlib.sha256(str(Path(config).resolve()).encode()).hexdigest()[:16]
    return location(run_root) / ".sweeps" / f"{digest}.json"


def record_runs(run_root, config: str, runs: list[dict]) -> None:
    path = progress_path(run_root, config)
    outputs.make_parent(path)
    outputs.write_json(path, {"config": str(config), "runs": runs})


def sweeps_with(run_root, output: str) -> list[dict]:
    """The recorded sweeps that have `output` (a path under the run root) in a run's chain."""
    folder = location(run_root) / ".sweeps"
    found = []
    for path in sorted(folder.glob("*.json")) if folder.exists() else []:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being rewritten
        if any(output in run["outputs"] or output in run["scores"] for run in record["runs"]):
            found.append(record)
    return found


def runs_done(run_root, record: dict) -> list[bool]:
    """Whether each run of a recorded sweep is complete, as its outputs on disk say."""
    root = location(run_root)
    return [all(outputs.is_complete(root / s) for s in run["scores"]) for run in record["runs"]]
