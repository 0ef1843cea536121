"""Sweeps: the grid, shared tokenization, reuse of finished runs, tables and plots."""
import csv
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
    assert (tmp_path / "out" / "ppl_vs_size.png").stat().st_size and (tmp_path / "out" / "kld_vs_size.png").is_file()
    assert len(list((root / "Tokenize").iterdir())) == 2                # once per ctx, not per run
    outputs = sorted(p.relative_to(root) for p in root.glob("*/*/manifest.json"))
    assert run_sweep(path, root)                                         # a rerun computes nothing
    assert sorted(p.relative_to(root) for p in root.glob("*/*/manifest.json")) == outputs


def sweep_cli(path, root):
    """`luigi --module pipeline Sweep --config PATH` from the repository root, as users type it."""
    cmd = [sys.executable, "-m", "luigi", "--module", "pipeline", "Sweep", "--config", str(path),
           "--run-root", str(root)]
    return subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)


def test_a_refused_point_is_a_row_and_the_kl_base_is_computed_once(tmp_path, model_path):
    base = model_path("smollm2-135m")
    copy = rewrite_gguf(base, tmp_path / "smollm2-copy.gguf", metadata={"general.name": "a copy"})
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(base.read_bytes()[:50_000_000])
    settings = 'ctx = 64\nchunks = 2\nwindow_layers = 15\ndevice = "cpu"\nkl_base = "smollm2-135m"\n'
    alone, grid_ = tmp_path / "alone.toml", tmp_path / "grid.toml"
    alone.write_text(f'models = ["smollm2-135m"]\nout = "{tmp_path / "alone"}"\n' + settings)
    grid_.write_text(f'models = ["smollm2-135m", "{copy}", "{truncated}"]\nout = "{tmp_path / "grid"}"\n' + settings)
    root = tmp_path / "runs"

    first = sweep_cli(alone, root)
    assert first.returncode == 0, first.stderr
    assert first.stderr.count("LayerWindow [15..30) cpu: chunk 1/1") == 1

    second = sweep_cli(grid_, root)     # the base's chain is not computed again for the copy's KLD
    assert second.stderr.count("LayerWindow [15..30) cpu: chunk 1/1") == 1, second.stderr
    assert_one_line_error(second, "1 of 3 runs of the sweep were refused (truncated.gguf)")
    rows = list(csv.DictReader(open(tmp_path / "grid" / "sweep.csv")))
    assert [r["status"] for r in rows] == ["ok", "ok", "refused"]
    assert "truncated.gguf is truncated" in rows[2]["reason"] and rows[2]["ppl"] == ""
    assert float(rows[0]["kld_mean"]) == 0 and float(rows[1]["kld_mean"]) == 0 and rows[0]["ppl"] == rows[1]["ppl"]
    assert "Sweep: 2/2 runs done" in second.stderr
