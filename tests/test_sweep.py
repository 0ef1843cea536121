"""Sweeps: the grid, shared tokenization, reuse of finished runs, tables and plots."""
import csv

import luigi

from pipeline import Sweep
from pipeline.flow.sweep import grid, load_sweep

SWEEP = """
name = "t"
models = ["smollm2-135m"]
ctx = [64, 128]
window_layers = [0, 15]
chunks = 2
kl_base = "smollm2-135m"
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
