"""Sweeps: the grid, shared tokenization, reuse of finished runs, tables and plots."""
import csv
import os
import subprocess
import sys

import luigi
import pytest

from pipeline import PerplexityRun, Sweep
from pipeline.errors import UserError
from pipeline.flow.sweep import grid, load_sweep, parse_point
from pipeline.paths import REPO_ROOT

from .helpers import assert_one_line_error
from .tiny_gguf import rewrite_gguf

SWEEP = """
name = "t"
models = ["smollm2-135m"]
ctx = [64, 128]
window_layers = [0, 15]
chunks = 2
kl_base = "smollm2-135m"
device = "cpu"
out = "{out}"
"""


def write_sweep(tmp_path):
    path = tmp_path / "sweep.toml"
    path.write_text(SWEEP.format(out=tmp_path / "out"))
    return path


def test_grid_crosses_every_axis(tmp_path):
    cfg = load_sweep(str(write_sweep(tmp_path)))
    points = grid(cfg)
    assert len(points) == 4
    assert {(p["ctx"], p["window_layers"]) for p in points} == {(64, 0), (64, 15), (128, 0), (128, 15)}
    assert all(p["model"] == "smollm2-135m" and p["chunks"] == 2 and p["kl_base"] == "smollm2-135m" for p in points)


def test_every_placement_setting_of_a_run_is_a_sweep_key(tmp_path):
    path = tmp_path / "sweep.toml"
    path.write_text('models = ["smollm2-135m"]\ncompute_dtype = ["float32", "bfloat16"]\ndevice_memory = "2GiB"\n'
                    'device = "cpu"\ngpu_layers = 10\nfirst_layer = 5\nboundary_dtype = "bfloat16"\nshards = 2\n')
    points = grid(load_sweep(str(path)))
    assert [p["compute_dtype"] for p in points] == ["float32", "bfloat16"]
    assert all(p["device_memory"] == "2GiB" and p["gpu_layers"] == 10 and p["first_layer"] == 5 and p["shards"] == 2
               and p["boundary_dtype"] == "bfloat16" and p["device"] == "cpu" for p in points)


def test_a_point_value_of_the_wrong_kind_is_refused_naming_its_key(tmp_path):
    path = tmp_path / "sweep.toml"
    path.write_text('models = ["smollm2-135m"]\nctx = ["abc", 64]\ncompute_dtype = "float8"\n')
    bad_ctx, good_ctx = grid(load_sweep(str(path)))
    with pytest.raises(UserError, match="ctx = 'abc': invalid literal"):
        parse_point(PerplexityRun, bad_ctx)
    with pytest.raises(UserError, match="compute_dtype = 'float8': float8 is not a valid choice"):
        parse_point(PerplexityRun, good_ctx)
    assert parse_point(PerplexityRun, {"ctx": 64, "window_layers": 15}) == \
        {"ctx": 64, "window_layers": "15"}


def run_sweep(path, root) -> bool:
    return luigi.build([Sweep(config=str(path), run_root=str(root))], local_scheduler=True, log_level="WARNING")


def test_sweep_writes_tables_and_plots_and_reuses_finished_runs(tmp_path):
    path, root = write_sweep(tmp_path), tmp_path / "runs"
    assert run_sweep(path, root)
    rows = list(csv.DictReader(open(tmp_path / "out" / "sweep.csv")))
    assert len(rows) == 4
    assert {r["ctx"] for r in rows} == {"64", "128"} and all(float(r["kld_mean"]) == 0 for r in rows)
    assert float(rows[0]["bits_per_weight"]) > 4  # Q4_1 blocks with their scales, plus the F32 norms
    assert (tmp_path / "out" / "sweep.md").read_text().count("\n") == 2 + 4
    assert (tmp_path / "out" / "kld_vs_bpw.png").stat().st_size
    assert (tmp_path / "out" / "ppl_ratio_vs_bpw.png").stat().st_size
    assert len(list((root / "Tokenize").iterdir())) == 2                # once per ctx, not per run
    outputs = sorted(p.relative_to(root) for p in root.glob("*/*/manifest.json"))
    assert run_sweep(path, root)                                         # a rerun computes nothing
    assert sorted(p.relative_to(root) for p in root.glob("*/*/manifest.json")) == outputs


def test_plots_are_what_quantization_sweeps_publish_each_series_named_once():
    """Against a KL base: mean KLD on a log scale and the PPL ratio against bits per weight, a
    series per value of what varies besides the model (here the context), each in the legend
    once, each point's name inside the frame; without a base, PPL against bits per weight."""
    from pipeline.flow.sweep import COLUMNS, plots

    def row(model, bpw, ctx, kld, status="ok"):
        return dict.fromkeys(COLUMNS) | {
            "model": model, "architecture": "llama", "status": status, "bits_per_weight": bpw, "ctx": ctx,
            "method": "llama-cpp", "kl_base": kld and "base.gguf", "placement": "cpu [0..30)", "ppl": 10 + (kld or 0),
            "kld_mean": kld, "ppl_ratio": kld and 1 + kld}

    quants = (("Q2_K", 2.6, 0.5), ("Q4_K_M", 4.8, 0.05), ("Q8_0", 8.5, 0.001))
    rows = [row(f"model-{q}-with-a-long-name.gguf", bpw, ctx, kld) for q, bpw, kld in quants for ctx in (256, 512)]
    rows.append(row("broken.gguf", 4.0, 256, None, status="failed"))
    drawn = plots(rows)
    assert [name for name, _ in drawn] == ["kld_vs_bpw.png", "ppl_ratio_vs_bpw.png"]
    for name, fig in drawn:
        ax = fig.axes[0]
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["ctx 256", "ctx 512"]
        assert ax.get_xlabel() == "bits per weight" and ax.get_yscale() == ("log" if name == "kld_vs_bpw.png"
                                                                             else "linear")
        fig.canvas.draw()
        frame = ax.get_window_extent()
        assert len(ax.texts) == 6
        for text in ax.texts:
            box = text.get_window_extent()
            assert frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1, name
    (name, fig), = plots([row(f"m{q}.gguf", bpw, 512, None) for q, bpw, _ in quants])
    assert name == "ppl_vs_bpw.png" and [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["ctx 512"]


def sweep_cli(path, root, fault: str = ""):
    """`luigi --module pipeline Sweep --config PATH` from the repository root, as users type it
    (with LAYERCYCLE_FAULT set to `fault`, where given)."""
    cmd = [sys.executable, "-m", "luigi", "--module", "pipeline", "Sweep", "--config", str(path),
           "--run-root", str(root)]
    env = {k: v for k, v in os.environ.items() if k != "LAYERCYCLE_FAULT"}
    env |= {"LAYERCYCLE_FAULT": fault} if fault else {}
    return subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=900, env=env)


def test_refused_and_failed_points_are_rows_and_nothing_is_computed_twice(tmp_path, model_path):
    """A sweep over a model, its copy and a truncated file, each alone and against the model as
    KL base: the truncated file's points are refused, the copy's fail on a NaN (injected) and are
    rows with the reason; run again, the copy's chain is computed once for both its Scores
    (its last boundary stays until both have read it) and the base's not again."""
    base = model_path("smollm2-135m")
    copy = rewrite_gguf(base, tmp_path / "smollm2-copy.gguf", metadata={"general.name": "a copy"})
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(base.read_bytes()[:50_000_000])
    settings = 'ctx = 64\nchunks = 2\nwindow_layers = 15\ndevice = "cpu"\n'
    alone, grid_ = tmp_path / "alone.toml", tmp_path / "grid.toml"
    alone.write_text(f'models = ["smollm2-135m"]\nkl_base = "smollm2-135m"\nout = "{tmp_path / "alone"}"\n' + settings)
    grid_.write_text(f'models = ["smollm2-135m", "{copy}", "{truncated}"]\nkl_base = ["", "smollm2-135m"]\n'
                     f'out = "{tmp_path / "grid"}"\n' + settings)
    root = tmp_path / "runs"

    first = sweep_cli(alone, root)
    assert first.returncode == 0, first.stderr
    assert first.stderr.count("LayerWindow [15..30) cpu: chunk 1/1") == 1

    # the copy's first window hits a NaN: its points are rows with the reason, the table is written
    second = sweep_cli(grid_, root, fault="non-finite@LayerWindow [0..15) cpu#1")
    assert_one_line_error(second, "2 refused (truncated.gguf, truncated.gguf); 2 failed (smollm2-copy.gguf, "
                                  "smollm2-copy.gguf) of the sweep's 6 runs")
    rows = list(csv.DictReader(open(tmp_path / "grid" / "sweep.csv")))
    assert [r["status"] for r in rows] == ["ok", "ok", "failed", "failed", "refused", "refused"]
    assert [r["kl_base"] for r in rows] == ["", "smollm2-135m"] * 3
    assert all("LayerWindow [0..15) cpu: a NaN or inf in chunk 0" in r["reason"] and r["ppl"] == "" for r in rows[2:4])
    assert all("truncated.gguf is truncated" in r["reason"] and r["ppl"] == "" for r in rows[4:])
    assert (tmp_path / "grid" / "sweep.md").read_text().count("\n") == 2 + 6

    third = sweep_cli(grid_, root)      # the failed points only, the copy's trunk once for its two Scores
    assert_one_line_error(third, "2 refused (truncated.gguf, truncated.gguf) of the sweep's 6 runs")
    assert third.stderr.count("LayerWindow [0..15) cpu: chunk 1/1") == 1, third.stderr
    assert third.stderr.count("LayerWindow [15..30) cpu: chunk 1/1") == 1, third.stderr
    assert third.stderr.count("Score: chunk 1/1") == 2, third.stderr
    rows = list(csv.DictReader(open(tmp_path / "grid" / "sweep.csv")))
    assert [r["status"] for r in rows] == ["ok", "ok", "ok", "ok", "refused", "refused"]
    assert float(rows[1]["kld_mean"]) == 0 and float(rows[3]["kld_mean"]) == 0
    assert rows[0]["ppl"] == rows[1]["ppl"] == rows[2]["ppl"] == rows[3]["ppl"]
    assert "Sweep: 4/4 runs done" in third.stderr


def test_a_compute_dtype_axis_shares_one_kl_base_chain_in_its_own_dtype(tmp_path, model_path):
    """compute_dtype = ["float32", "bfloat16"] against a base: the base's chain is computed once,
    in the first listed dtype (the table says which); the model, a copy of the base, is then
    exactly the base in float32 (KLD 0) and not in bfloat16 (against a float32 base)."""
    base = model_path("smollm2-135m")
    copy = rewrite_gguf(base, tmp_path / "smollm2-copy.gguf", metadata={"general.name": "a copy"})
    path = tmp_path / "dtypes.toml"
    path.write_text(f'models = ["{copy}"]\nkl_base = "smollm2-135m"\ncompute_dtype = ["float32", "bfloat16"]\n'
                    f'ctx = 64\nchunks = 1\nwindow_layers = 0\ndevice = "cpu"\nout = "{tmp_path / "out"}"\n')
    done = sweep_cli(path, tmp_path / "runs")
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("LayerWindow [0..30) cpu: chunk 1/1") == 3, done.stderr   # the copy twice, the base once
    rows = list(csv.DictReader(open(tmp_path / "out" / "sweep.csv")))
    assert [(r["compute_dtype"], r["kl_base"], r["kl_base_dtype"]) for r in rows] == [
        ("float32", "smollm2-135m", "float32"), ("bfloat16", "smollm2-135m", "float32")]
    assert float(rows[0]["kld_mean"]) == 0 < float(rows[1]["kld_mean"])
    assert "kl_base_dtype" in (tmp_path / "out" / "sweep.md").read_text()
