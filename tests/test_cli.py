"""The command users type: `luigi --module pipeline PerplexityRun ...` from the repository root."""
import pytest
import torch

from .helpers import assert_one_line_error, luigi_cli


def test_default_run_prints_the_result_table(tmp_path):
    done = luigi_cli("--chunks", "2", run_root=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Layer placement  cpu [0..30)" in done.stdout   # auto: this machine holds the whole trunk
    assert "PPL" in done.stdout and "--chunks 0" in done.stdout
    assert "chunk 1/1" in done.stderr  # progress while tasks run


def test_missing_model_file(tmp_path):
    assert_one_line_error(luigi_cli("--model", str(tmp_path / "none.gguf"), run_root=tmp_path), "neither")


def test_ctx_above_model_context(tmp_path):
    assert_one_line_error(luigi_cli("--ctx", "100000", run_root=tmp_path), "above the model's context")


def test_corpus_shorter_than_two_windows(tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("Only a few words here.")
    assert_one_line_error(luigi_cli("--corpus", str(short), run_root=tmp_path), "needs at least")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_cuda_without_cuda(tmp_path):
    assert_one_line_error(luigi_cli("--device", "cuda", run_root=tmp_path), "no CUDA device")


def test_tokens_file_outside_the_vocabulary(tmp_path):
    ids = tmp_path / "ids.txt"
    ids.write_text(" ".join(["5"] * 2000 + ["99999"]))
    done = luigi_cli("--tokens-file", str(ids), "--ctx", "256", run_root=tmp_path)
    assert_one_line_error(done, "outside the vocabulary")


def test_cycle_with_first_layer(tmp_path):
    done = luigi_cli("--gpu-layers", "4", "--first-layer", "2", "--cycle", run_root=tmp_path)
    assert_one_line_error(done, "--cycle slides the device window across the whole trunk; --first-layer 2")
