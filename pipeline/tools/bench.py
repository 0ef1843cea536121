"""Benchmark: llama-perplexity and layercycle side by side, in one run on one machine.

    python -m pipeline.bench [--config configs/bench/default.toml]

For each model: llama-perplexity, layercycle with the whole trunk in one window, and cycled
with each window size; tokens/s and wall time of the whole process (model load and
tokenization included on both sides), the ratio to llama-perplexity, the largest peak RSS of a
window task and of any task (each task's own peak, measured in the one worker process as a
user's run has it), bytes per boundary, and where layercycle's time went. The runs take turns,
one repetition of each at a time; each row is the run of median wall time. Also writes a PNG plot.
"""
import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UserError
from ..gguf_io.reader import open_gguf
from ..paths import CONFIGS, REPO_ROOT
from .llamacpp import FINAL, llama_perplexity, parse_final_estimate


@dataclass
class Row:
    name: str
    window: int | str | None    # layers per window; 0 whole trunk; "auto"; None for llama-perplexity
    wall_s: float
    tokens_per_s: float
    ppl: float
    window_rss_mb: float = 0.0  # largest peak RSS of a LayerWindow task
    peak_rss_mb: float = 0.0    # largest peak RSS of any task (the Score task holds the LM head)
    boundary_mb: float = 0.0
    split: dict = field(default_factory=dict)
    refused: str = ""           # the one-line reason when layercycle refused the run
    device: str = "cpu"         # where it ran (llama-perplexity is built for the CPU; layercycle: its windows' devices)
    process_rss_mb: float = 0.0  # peak RSS of the whole process (tree), sampled from outside
    placement: str = ""         # layercycle: the windows it ran
    numerics: str = "exact"     # layercycle: its --numerics


def load_config(path: Path) -> dict:
    """A bench config; one that names a `base` (a config beside it) takes that one's keys where it
    sets none."""
    with open(path, "rb") as f:
        cfg = tomllib.load(f)
    if "base" in cfg:
        cfg = load_config(path.parent / cfg.pop("base")) | cfg
    if "corpus" in cfg:
        cfg["corpus"] = str((REPO_ROOT / cfg["corpus"]).resolve())
    return cfg


def _env(threads: int) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def bench_model(alias: str, model: Path, binary: Path | None, cfg: dict) -> list[Row]:
    """Each run of the table once per repetition, in turn, so that a slow spell of the machine
    falls on all of them alike; then the run of median wall time of each."""
    runs = [functools.partial(llama_once, binary, model, cfg)] if binary else []
    runs += [functools.partial(layercycle_once, alias, model, w, cfg, numerics) for w in cfg["window_sizes"]
             for numerics in cfg.get("numerics", ["exact"])]
    samples: list[list[Row]] = [[] for _ in runs]
    for _ in range(cfg["repetitions"]):
        for run, rows in zip(runs, samples):
            if not (rows and rows[0].refused):  # a refusal is not repeated
                if cfg.get("drop_page_cache"):
                    drop_page_cache()
                rows.append(run())
    return [sorted(rows, key=lambda r: r.wall_s)[len(rows) // 2] for rows in samples]


def drop_page_cache() -> None:
    """Every clean page of the page cache dropped (Linux, as root): the command that follows
    reads its model from the disk, as the first pass of a night does."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError as e:
        raise UserError(f"drop_page_cache = true needs root (/proc/sys/vm/drop_caches: {e.strerror})") from None


def run_sampled(cmd: list[str], **kwargs) -> tuple[subprocess.CompletedProcess, float, float]:
    """Run `cmd`; return its outcome, wall seconds and the peak RSS (MB) of its process tree,
    sampled from outside every 0.2 s (a task's own high-water mark is reset per task)."""
    start, peak = time.perf_counter(), [0]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
    finished = threading.Event()

    def sample():
        while not finished.wait(0.2):
            peak[0] = max(peak[0], _tree_rss_kb(proc.pid))
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    finished.set()
    sampler.join()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err), time.perf_counter() - start, peak[0] / 1024


def _tree_rss_kb(pid: int) -> int:
    """VmRSS of a process and its descendants (Linux /proc), KiB; 0 once it is gone."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            status = Path(f"/proc/{p}/status").read_text()
            children = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        total += next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
        todo += [int(c) for c in children]
    return total


# llama-perplexity at times exits 0 with the end of its output missing (3 of 20 runs of a 0.2 s pass
# on a tiny model here, none of 10 on SmolLM2): such a run is run again, this many times in all
LLAMA_ATTEMPTS = 3


def llama_once(binary: Path, model: Path, cfg: dict) -> Row:
    """One llama-perplexity run, timed; run again where it exits 0 without its final estimate."""
    for attempt in range(1, LLAMA_ATTEMPTS + 1):
        done, wall, rss = run_sampled([str(binary), "-m", str(model), "-f", cfg["corpus"], "-c", str(cfg["ctx"]),
                                       "-b", str(cfg["ctx"]), "-t", str(cfg["threads"]), "--chunks",
                                       str(cfg["chunks"])], env=_env(cfg["threads"]))
        if done.returncode:
            raise UserError(f"llama-perplexity failed on {model}: {done.stderr.strip().splitlines()[-1:]}")
        if attempt == LLAMA_ATTEMPTS or FINAL.search(done.stdout + done.stderr):
            ppl, _ = parse_final_estimate(done.stdout + done.stderr)
            return Row("llama-perplexity", None, wall, cfg["chunks"] * cfg["ctx"] / wall, ppl, process_rss_mb=rss)


def layercycle_once(alias: str, model: Path, window: int | str, cfg: dict, numerics: str = "exact") -> Row:
    name = "layercycle " + {0: "whole", "auto": "auto"}.get(window, f"cycled {window}")
    name += f", {numerics} numerics" if numerics != "exact" else ""
    with tempfile.TemporaryDirectory(prefix="layercycle-bench-") as tmp:
        root = Path(tmp)
        cmd = [sys.executable, "-m", "luigi", "--module", "pipeline", "PerplexityRun", "--model", str(model),
               "--task", "wikitext-2", "--corpus", cfg["corpus"], "--ctx", str(cfg["ctx"]),
               "--chunks", str(cfg["chunks"]), "--window-layers", str(window),
               "--compute-dtype", cfg["compute_dtype"], "--device", cfg.get("device", "auto"), "--run-root", str(root),
               "--numerics", numerics, "--result-json", str(root / "result.json")]
        cmd += ["--device-memory", cfg["device_memory"]] if cfg.get("device_memory") else []
        done, wall, rss = run_sampled(cmd, cwd=REPO_ROOT, env=_env(cfg["threads"]))
        if done.returncode:
            reason = (done.stderr.strip().splitlines() or ["no output"])[-1]
            if "ERROR: layercycle:" not in reason:
                raise UserError(f"layercycle failed on {alias}: {reason}")
            return Row(name, window, wall, 0.0, float("nan"), refused=reason.split("ERROR: layercycle: ")[-1],
                       numerics=numerics)
        manifests = [json.loads(p.read_text()) for p in root.glob("*/*/manifest.json")]
        result = json.loads((root / "result.json").read_text())
    windows = [m for m in manifests if m["task"] == "LayerWindow"]
    return Row(name, window, wall, cfg["chunks"] * cfg["ctx"] / wall, result["ppl"],
               device="+".join(sorted({w["device"] for w in result["placement"]})), process_rss_mb=rss,
               placement=result["placement_text"], numerics=numerics,
               window_rss_mb=max(m["peak_rss_mb"] for m in windows),
               peak_rss_mb=max(m["peak_rss_mb"] for m in manifests if m["task"] != "Tokenize"),
               boundary_mb=statistics.mean(m["bytes_written"] for m in windows) / 2**20, split=_split(manifests))


def _split(manifests: list[dict]) -> dict:
    """Seconds in weight load/dequant (of which waiting on the file's pages, and hidden behind the
    compute: a window's later layers load beside its first chunk), compute (its waits for layers
    not counted), boundary I/O and scoring, over all tasks."""
    parts = {"load": 0.0, "read_wait": 0.0, "load_hidden": 0.0, "compute": 0.0, "io": 0.0, "scoring": 0.0}
    for m in manifests:
        s = m.get("seconds", {})
        if m["task"] == "Score":
            parts["scoring"] += sum(s.values())
            continue
        waited = m.get("weight_load_waited_s", 0.0)
        parts["load"] += s.get("load", 0.0) + m.get("weight_load_s", 0.0)
        parts["load_hidden"] += m.get("weight_load_s", 0.0) - waited
        parts["read_wait"] += m.get("weight_read_wait_s", 0.0)
        parts["compute"] += s.get("compute", 0.0) - waited
        parts["io"] += s.get("read", 0.0) + s.get("write", 0.0)
    return parts


def print_table(alias: str, rows: list[Row]) -> None:
    base = rows[0].tokens_per_s if rows[0].window is None else None
    print(f"\n## {alias}\n")
    print("| run | ran on | tokens/s | wall s | ratio | PPL | peak RSS window task MB | peak RSS any task MB "
          "| peak RSS process MB | boundary MB | load s | of it read wait s | of it beside compute s | compute s "
          "| compute tokens/s | I/O s | scoring s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r.refused:
            print(f"| {r.name} | - | refused: {r.refused} |" + " |" * 14)
            continue
        sp = r.split
        ratio = f"{r.tokens_per_s / base:.2f}" if base else "-"
        cells = [r.name, r.device, f"{r.tokens_per_s:.1f}", f"{r.wall_s:.1f}", ratio, f"{r.ppl:.4f}",
                 *(f"{v:.0f}" if v else "-" for v in (r.window_rss_mb, r.peak_rss_mb, r.process_rss_mb)),
                 f"{r.boundary_mb:.1f}" if r.boundary_mb else "-",
                 *(f"{sp[k]:.1f}" if sp else "-" for k in ("load", "read_wait", "load_hidden", "compute")),
                 f"{r.tokens_per_s * r.wall_s / sp['compute']:.1f}" if sp and sp["compute"] else "-",
                 *(f"{sp[k]:.1f}" if sp else "-" for k in ("io", "scoring"))]
        print("| " + " | ".join(cells) + " |")
    for r in rows:
        if r.placement:
            print(f"\n{r.name}: {r.placement}")


def plot(results: dict[str, list[Row]], n_layers: dict[str, int], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("the plot needs matplotlib: pip install -e '.[plot]'") from None
    fig, (speed, memory) = plt.subplots(1, 2, figsize=(11, 4))
    for alias, rows in results.items():
        for numerics in dict.fromkeys(r.numerics for r in rows if r.window is not None):   # a line each, in order
            cycled = sorted(((r.window or n_layers[alias], r) for r in rows
                             if isinstance(r.window, int) and not r.refused and r.numerics == numerics),
                            key=lambda pair: pair[0])
            xs, label = [x for x, _ in cycled], alias if numerics == "exact" else f"{alias}, {numerics} numerics"
            speed.plot(xs, [r.tokens_per_s for _, r in cycled], marker="o", label=label)
            memory.plot(xs, [r.window_rss_mb for _, r in cycled], marker="o", label=label)
        if rows[0].window is None:
            speed.axhline(rows[0].tokens_per_s, linestyle="--", linewidth=1, color=speed.lines[-1].get_color())
    speed.set(xlabel="layers per window (rightmost: whole trunk)", ylabel="tokens/s",
              title="tokens/s (dashed: llama-perplexity)")
    memory.set(xlabel="layers per window (rightmost: whole trunk)", ylabel="MB", title="peak RSS of a window task")
    for ax in (speed, memory):
        ax.set_xscale("log", base=2)
        ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=CONFIGS / "bench" / "default.toml")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config)
        if cfg.get("kind") == "dequantizers":
            from .dequant_bench import bench_dequantizers

            bench_dequantizers(cfg)
            return 0
        if cfg.get("kind") == "choice-tasks":
            from .choice_bench import bench_choice_tasks

            bench_choice_tasks(cfg)
            return 0
        if cfg.get("kind") == "moe-chunk":
            from .moe_bench import bench_moe_chunks

            bench_moe_chunks(cfg)
            return 0
        binary = llama_perplexity(cfg["llama_cpp_python"]) if cfg.get("llama_perplexity", True) else None
        results, n_layers = {}, {}
        for alias in cfg["models"]:
            model = model_path(alias, cfg)
            rows = bench_model(alias, model, binary, cfg)
            print_table(alias, rows)
            results[alias] = rows
            n_layers[alias] = _n_layers(model)
        sized = any(isinstance(r.window, int) for rows in results.values() for r in rows)
        if sized and cfg.get("plot"):   # a size axis to plot, and a file to plot it to
            plot(results, n_layers, REPO_ROOT / cfg["plot"])
            print(f"\nplot: {cfg['plot']}")
    except UserError as e:
        print(f"layercycle bench: {e}", file=sys.stderr)
        return 1
    return 0


def model_path(alias: str, cfg: dict) -> Path:
    from .synthetic import synthetic_or_registered

    return synthetic_or_registered(alias, cfg.get("synthetic", {}))


def _n_layers(model: Path) -> int:
    from ..model.arch import load_architecture

    return load_architecture(open_gguf(str(model))).hp.n_layers


