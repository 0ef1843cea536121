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
        "compute_dtype", "boundary_dtype", "numerics", "shards", "task", "corpus", "tokens_file", "chunks", "stride",
        "unscored_prefix", "bos", "kl_base", "kl_base_dtype", "sequences_per_chunk", "windows_per_chunk", "hellaswag",
        "hellaswag_tasks", "winogrande", "winogrande_tasks", "multiple_choice", "multiple_choice_tasks", "escape")
# paths relative to the repository root
FILE_KEYS = ("corpus", "tokens_file", "hellaswag", "winogrande", "multiple_choice")
COLUMNS = ("model", "architecture", "status", "file_gb", "bits_per_weight", "ctx", "method", "compute_dtype",
           "numerics", "kl_base", "kl_base_dtype", "placement", "ppl", "ppl_stderr", "mean_nll", "accuracy", "kld_mean",
           "kld_p99", "same_top",
           "ppl_ratio", "elapsed_s", "tokens_per_s", "reason")


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
        if not cfg["kl_base_dtype"] and len(cfg["compute_dtype"]) > 1:   # the base's chain once, not per dtype
            cfg["kl_base_dtype"] = cfg["compute_dtype"][:1]
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
    return {"model": Path(result["model"]["path"]).name, "architecture": result["model"]["architecture"],
            "status": "ok", "file_gb": round(file_gb, 4),
            "bits_per_weight": round(bpw, 3), "ctx": result["ctx"], "method": result["method"],
            "compute_dtype": result["compute_dtype"], "numerics": result.get("numerics", "exact"),
            "kl_base": Path(k["base"]).name if k else None, "kl_base_dtype": k.get("base_dtype"),
            "placement": result["placement_text"], "ppl": result.get("ppl"), "ppl_stderr": result.get("ppl_stderr"),
            "mean_nll": result.get("mean_nll"), "accuracy": result.get(result["method"], {}).get("accuracy"),
            "kld_mean": k.get("mean"), "kld_p99": k.get("p99"),
            "same_top": k.get("same_top"), "ppl_ratio": k.get("ppl_ratio"), "elapsed_s": round(result["elapsed_s"], 1),
            "tokens_per_s": result["tokens_per_s"] and round(result["tokens_per_s"], 1), "reason": None}


def point_row(params: dict, status: str, reason: str) -> dict:
    """The row of a grid point that was refused or failed while it ran: what the sweep file set,
    and why."""
    row = dict.fromkeys(COLUMNS)
    return row | {"model": Path(params["model"]).name, "status": status, "ctx": params.get("ctx"),
                  "method": params.get("method"), "compute_dtype": params.get("compute_dtype"),
                  "numerics": params.get("numerics"),
                  "kl_base": Path(params["kl_base"]).name if params.get("kl_base") else None, "reason": reason}


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


# what tells a sweep's points apart besides the model: the series of its plots are the values of
# those that vary (a model's architecture too, where several are swept)
SERIES_KEYS = ("architecture", "ctx", "method", "compute_dtype", "numerics", "kl_base", "placement")


def series_label(row: dict, varying: list[str]) -> str:
    names = {"architecture": "{}", "ctx": "ctx {}", "method": "{}", "compute_dtype": "{}", "numerics": "{} numerics",
             "kl_base": "base {}", "placement": "{}"}
    shown = varying or ["ctx"] + (["kl_base"] if row["kl_base"] else [])   # one series: say what it is
    return ", ".join(names[k].format(row[k]) for k in shown)


def plots(rows: list[dict]) -> list[tuple[str, object]]:
    """(file name, figure) of each plot of the sweep's computed rows, as quantization sweeps are
    published: with a KL base, mean KLD (log scale) and the PPL ratio against bits per weight;
    without, PPL against bits per weight. One series per value of what varies besides the
    model (base, context, method, compute dtype, placement, architecture), each in the legend once; each point
    named by its model, the names kept inside the frame."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in rows if r["status"] == "ok"]
    compared = [r for r in done if r["kld_mean"] is not None]
    panels = ([("kld_mean", "mean KLD", True, "kld_vs_bpw.png"), ("ppl_ratio", "PPL(Q) / PPL(base)", False,
                                                                  "ppl_ratio_vs_bpw.png")] if compared else
              [("ppl", "PPL", False, "ppl_vs_bpw.png")])
    points = compared or [r for r in done if r["ppl"] is not None]
    varying = [k for k in SERIES_KEYS if len({r[k] for r in points}) > 1]
    figures = []
    for column, label, log_scale, name in panels if points else []:
        fig, ax = plt.subplots(figsize=(7.5, 4.8))
        series: dict[str, list[dict]] = {}
        for r in points:
            series.setdefault(series_label(r, varying), []).append(r)
        for text, group in series.items():
            group = sorted(group, key=lambda r: r["bits_per_weight"])
            ys = [max(r[column], 1e-9) if log_scale else r[column] for r in group]
            ax.plot([r["bits_per_weight"] for r in group], ys, marker="o", label=text)
            for r, y in zip(group, ys, strict=True):
                ax.annotate(r["model"], (r["bits_per_weight"], y), xytext=(4, 4), textcoords="offset points",
                            fontsize=7)
        if log_scale:
            ax.set_yscale("log")
        ax.margins(x=0.15, y=0.15)
        ax.set(xlabel="bits per weight", ylabel=label, title=f"{label} against bits per weight")
        ax.legend(fontsize=8, loc="best")
        fig.tight_layout()
        keep_inside(fig, ax)
        figures.append((name, fig))
    return figures


def keep_inside(fig, ax) -> None:
    """Each point's name on the side of its point that keeps it inside the frame."""
    fig.canvas.draw()
    frame = ax.get_window_extent()
    for name in ax.texts:
        box = name.get_window_extent()
        dx, dy = name.xyann
        if box.x1 > frame.x1:
            name.set_horizontalalignment("right")
            dx = -abs(dx)
        if box.y1 > frame.y1:
            name.set_verticalalignment("top")
            dy = -abs(dy)
        name.xyann = (dx, dy)


def write_plots(rows: list[dict], out: Path) -> list[Path]:
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("the sweep's plots need matplotlib: pip install -e '.[plot]'") from None
    written = []
    for name, fig in plots(rows):
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
