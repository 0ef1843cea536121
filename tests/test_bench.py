"""The benchmark's parsing and bookkeeping (the benchmark itself runs outside CI)."""
import pytest

from pipeline.bench import _split
from pipeline.errors import UserError
from pipeline.llamacpp import parse_final_estimate

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
    from pipeline.synthetic import Shape, write_synthetic_gguf

    from .conftest import run_pipeline

    path = write_synthetic_gguf(tmp_path / "synthetic.gguf", Shape(layers=3, hidden=256, ffn=512, heads=4, kv_heads=2),
                                model_path("smollm2-135m"))
    assert not (tmp_path / "synthetic.gguf.partial").exists()
    r = run_pipeline(tmp_path / "run", model=str(path), ctx=64, chunks=2, window_layers=2)
    assert r["model"]["n_layers"] == 3 and r["largest_window"]["first"] == 0
    assert 1.0 < r["ppl"] < float("inf")


def test_gpu_check_without_cuda_says_so_in_one_line(capsys):
    import torch

    from pipeline import gpu_check

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: run python -m pipeline.gpu_check itself")
    assert gpu_check.main([]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["layercycle gpu_check: no CUDA device: this check needs a GPU machine"]
