"""CUDA is asked about in a child process, never initialised by the process that schedules the
tasks; --compute-dtype auto follows what the device computes."""
import pytest
import torch

from pipeline.errors import UserError
from pipeline.flow.trunk import compute_dtype_name
from pipeline.run import cuda_probe, preflight


@pytest.fixture
def a_gpu_without_bfloat16(monkeypatch):
    monkeypatch.setattr(cuda_probe, "_probe", lambda: {"free": 12 * 2**30, "total": 16 * 2**30, "bf16": False})

    def initialised(*args, **kwargs):
        raise AssertionError("CUDA was initialised in the scheduling process")
    for name in ("mem_get_info", "is_bf16_supported", "is_available", "device_count", "init"):
        monkeypatch.setattr(torch.cuda, name, initialised)
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)


def test_auto_is_float16_on_a_gpu_without_bfloat16(a_gpu_without_bfloat16):
    assert compute_dtype_name("auto", "cuda") == "float16"
    assert compute_dtype_name("auto", "cpu") == "float32"
    assert compute_dtype_name("bfloat16", "cuda") == "bfloat16"


def test_free_device_memory_comes_from_the_probe(a_gpu_without_bfloat16):
    assert preflight.available_bytes("cuda") == 12 * 2**30


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_the_probe_runs_in_a_child_process_and_says_why_it_failed():
    cuda_probe._probe.cache_clear()
    with pytest.raises(UserError, match="the CUDA device could not be queried"):
        cuda_probe.cuda_facts()
    assert isinstance(cuda_probe._probe(), str)   # asked once: the answer is kept
    cuda_probe._probe.cache_clear()


def test_the_placement_finds_the_gpu_without_asking_torch_cuda(a_gpu_without_bfloat16, tmp_path):
    from pipeline import PerplexityRun

    run = PerplexityRun(model="smollm2-135m", device="auto", run_root=str(tmp_path), device_memory="4GiB")
    windows = run.placement(check_memory=False)
    assert {w.device for w in windows} == {"cuda"}


def test_cuda_asked_for_where_there_is_none_is_one_line(monkeypatch):
    from pipeline.run.placement import resolve_device

    monkeypatch.setattr(cuda_probe, "_probe", lambda: "RuntimeError: Found no NVIDIA driver on your system.")
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
    assert resolve_device("auto") == "cpu"
    with pytest.raises(UserError, match=r"no CUDA device is available \(RuntimeError: Found no NVIDIA driver"):
        resolve_device("cuda")
