"""Outputs are keyed by the device type that computes them, and the placement row says where
each window was computed, as its output records it (checked on the CPU with a CUDA placement
that is named, never run)."""
import json

from pipeline import LayerWindow, Score

from .helpers import HEAD40K, run_pipeline

PARAMS = dict(task="wikitext-2", corpus=str(HEAD40K), ctx=128, chunks=2, compute_dtype="bfloat16")


def test_a_cuda_output_is_never_a_cpu_one(tmp_path):
    cpu = LayerWindow(run_root=str(tmp_path), placement="cpu:0:4,cpu:4:30", first=4, last=30, **PARAMS)
    cuda = LayerWindow(run_root=str(tmp_path), placement="cuda:0:4,cuda:4:30", first=4, last=30, **PARAMS)
    assert cpu.out_dir() != cuda.out_dir()
    assert "device" not in cpu.identity() and cuda.identity()["device"] == "cuda"   # CPU names as before
    scores = [Score(run_root=str(tmp_path), placement=p, **PARAMS) for p in ("cpu:0:30", "cuda:0:30")]
    assert scores[0].out_dir() != scores[1].out_dir()


def test_the_placement_row_comes_from_the_outputs(tmp_path):
    params = dict(task="wikitext-2", corpus=str(HEAD40K), ctx=128, chunks=2, window_layers=10)
    first = run_pipeline(tmp_path, **params)
    assert first["placement_text"] == "cpu [0..10) [10..20) [20..30)"
    manifest_path = next(p for p in (tmp_path / "LayerWindow").glob("*/manifest.json")
                         if json.loads(p.read_text())["identity"]["layers"] == [10, 20])
    manifest = json.loads(manifest_path.read_text())
    manifest_path.write_text(json.dumps({**manifest, "device": "cuda"}))   # as if it had been computed there
    again = run_pipeline(tmp_path, **params)
    assert again["placement_text"] == "cpu [0..10), cuda [10..20), cpu [20..30)"
    assert again["placement"][1] == {"device": "cuda", "first": 10, "last": 20, "expert_slices": 1}
