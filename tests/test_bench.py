"""The benchmark's parsing and bookkeeping (the benchmark itself runs outside CI)."""
import pytest

from pipeline.errors import UserError
from pipeline.tools.bench import _split
from pipeline.tools.llamacpp import parse_final_estimate

# the closing lines llama-perplexity printed for SmolLM2, head40k, ctx 512, --chunks 4
LLAMA_OUTPUT = """[1]13.0665,[2]21.4582,[3]22.6003,[4]22.8855,
0.12.864.566 I Final estimate: PPL = 22.8855 +/- 2.29357
"""


def test_final_estimate_is_parsed():
    assert parse_final_estimate(LLAMA_OUTPUT) == (22.8855, 2.29357)
    with pytest.raises(UserError, match="no final estimate"):
        parse_final_estimate("main: error: failed to load model")


def test_time_split_separates_io_and_scoring():
    manifests = [
        {"task": "Tokenize", "seconds": {}},
        {"task": "Embed", "seconds": {"read": 0.1, "compute": 0.5, "write": 0.2}},
        {"task": "LayerWindow", "seconds": {"load": 1.0, "read": 0.3, "compute": 4.0, "write": 0.4}},
        {"task": "Score", "seconds": {"load": 0.5, "read": 0.1, "compute": 2.0, "write": 0.1}},
    ]
    assert _split(manifests) == pytest.approx({"load": 1.0, "compute": 4.5, "io": 1.0, "scoring": 2.7})


def test_synthetic_model_runs_through_the_pipeline(tmp_path, model_path):
    from pipeline.tools.synthetic import Shape, write_synthetic_gguf

    from .helpers import run_pipeline

    path = write_synthetic_gguf(tmp_path / "synthetic.gguf", Shape(layers=3, hidden=256, ffn=512, heads=4, kv_heads=2),
                                model_path("smollm2-135m"))
    assert not (tmp_path / "synthetic.gguf.partial").exists()
    r = run_pipeline(tmp_path / "run", model=str(path), ctx=64, chunks=2, window_layers=2)
    assert r["model"]["n_layers"] == 3 and r["largest_window"]["first"] == 0
    assert 1.0 < r["ppl"] < float("inf")


def test_gpu_check_without_cuda_says_so_in_one_line(capsys):
    import torch

    from pipeline.tools import gpu_check

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: run python -m pipeline.gpu_check itself")
    assert gpu_check.main([]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["layercycle gpu_check: no CUDA device: this check needs a GPU machine"]


def test_gpu_check_flow_on_the_cpu(capsys, model_path):
    """The check's passes, table and comparisons, with the CPU standing in for the GPU."""
    from pipeline.tools import gpu_check

    from .helpers import HEAD40K

    model_path("smollm2-135m")
    cfg = {"corpus": str(HEAD40K), "ctx": 128, "chunks": 2, "device": "cpu", "window_layers": 8,
           "compute_dtype": "bfloat16", "mean_nll_rel_tol": 0.003}
    assert gpu_check.check_model("smollm2-135m", cfg)
    out = capsys.readouterr().out.splitlines()
    rows = [line.split(" | ") for line in out if line.startswith("| cpu ")]
    assert [r[0] for r in rows] == ["| cpu float32 whole", "| cpu bfloat16 whole", "| cpu bfloat16 cycled"]
    assert all(r[-1] == "- |" for r in rows)  # no CUDA peak on the CPU
    assert [line.split(":")[0] for line in out[-2:]] == ["cycled vs whole (GPU)", "GPU vs CPU"]
    assert all("% (ok, limit 0.3%)" in line for line in out[-2:])


def test_runs_take_turns_and_the_median_run_is_quoted(monkeypatch):
    from pipeline.tools import bench

    calls = []
    walls = iter([5.0, 9.0, 1.0, 7.0, 3.0, 8.0])

    def llama_once(binary, model, cfg):
        calls.append("llama")
        return bench.Row("llama-perplexity", None, next(walls), 0.0, 1.0)

    def layercycle_once(alias, model, window, cfg):
        calls.append(window)
        if window == 4:
            return bench.Row("layercycle cycled 4", 4, 0.1, 0.0, float("nan"), refused="does not fit")
        return bench.Row("layercycle whole", 0, next(walls), 0.0, 1.0)

    monkeypatch.setattr(bench, "llama_once", llama_once)
    monkeypatch.setattr(bench, "layercycle_once", layercycle_once)
    rows = bench.bench_model("m", None, "llama-perplexity", {"window_sizes": [0, 4], "repetitions": 3})
    assert calls == ["llama", 0, 4, "llama", 0, "llama", 0]  # in turn; a refusal is not repeated
    assert [r.wall_s for r in rows] == [3.0, 8.0, 0.1]       # medians of (5, 1, 3) and (9, 7, 8)
    assert rows[2].refused == "does not fit"
