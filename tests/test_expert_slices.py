"""A layer larger than its device runs its routed experts in slices: bit-identical to the
layer held whole, planned by the preflight instead of refused, and refused in one line where
not even one expert fits."""
import json

import pytest
import torch

from pipeline.errors import UserError
from pipeline.gguf_io.reader import GGUFIndex
from pipeline.model.arch import load_architecture
from pipeline.model.executor import WindowExecutor

from .helpers import HEAD40K, hidden_after, run_pipeline

# two layers of 128 experts, 4.5 MiB each in float32 (600 MiB a layer): with the LM head and the
# runtime (0.82 GiB for the Score task) a budget that holds the head cannot hold a layer
BIG_EXPERTS = dict(family="qwen3moe", layers=2, hidden=256, heads=4, kv_heads=2, head_dim=64, quant="Q4_K",
                   experts=128, experts_used=8, expert_ffn=1536)


# two packed rows of 40 (SequencePlan.layout: position, sequence, branch): 10 shared tokens and two
# branches of 15; two sequences of 20
PACKED_LAYOUT = torch.tensor([[(p, 0, 0) for p in range(10)] + [(10 + p, 0, b) for b in (1, 2) for p in range(15)],
                              [(p, s, 0) for s in (0, 1) for p in range(20)]])


@pytest.mark.parametrize("name", ["qwen3moe", "nemotron_h_moe", "qwen3next_fused", "deepseek2", "gpt-oss", "llama4"])
def test_sliced_experts_give_the_held_layer_bit_for_bit(tiny_model, name):
    """Softmax routing; sigmoid routing with a selection bias and a shared expert; gate and up
    fused in one tensor; expert groups (8 experts: 2 to 4 a slice); per-expert biases; the
    routing weight applied to the expert's input: every slice count gives the unsliced window's
    hidden state exactly."""
    _, path = tiny_model(name)
    held = hidden_after(path, 1)
    for slices in (2, 3, 4):                      # 4 experts: 2, 2+2 ... one expert a slice
        assert torch.equal(hidden_after(path, slices), held), slices
    assert torch.equal(hidden_after(path, 3, torch.bfloat16), hidden_after(path, 1, torch.bfloat16))


@pytest.mark.parametrize("name", ["qwen3moe", "nemotron_h_moe", "deepseek2", "gpt-oss"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_layer_staged_then_finished_gives_the_held_layer(tiny_model, name, dtype):
    """The three steps a sliced pass takes over each chunk, staging (the layer's forward up to its
    routing), each slice's experts added into the accumulator, and the finish (the forward run
    again, the staged outputs of the blocks before the MoE given back), give the held layer's
    output bit for bit: after attention (qwen3moe), with nothing before the MoE in its layer
    (nemotron_h_moe), after latent attention (deepseek2), after attention with sinks (gpt-oss);
    over packed rows, their layout given to each step."""
    from pipeline.model.sliced import SlicedLayer

    from .helpers import random_ids

    _, path = tiny_model(name)
    arch = load_architecture(GGUFIndex(path))
    i = next(s.index for s in arch.specs if s.ffn == "moe")
    x = arch.embed(random_ids(2, 40, seed=5) % arch.hp.vocab, "cpu", torch.float32)   # [2, 40, hidden]
    if i:                                                                          # the layer's input
        x = WindowExecutor(arch, 0, i, "cpu", torch.float32)(x)
    layout = PACKED_LAYOUT
    held = WindowExecutor(arch, i, i + 1, "cpu", dtype)(x, layout=layout)
    if name != "nemotron_h_moe":            # the layout is what the layer's attention sees (that one has none)
        assert not torch.equal(WindowExecutor(arch, i, i + 1, "cpu", dtype)(x), held)
    layer = SlicedLayer(arch, i, "cpu", dtype, 2)
    staged = layer.stage(x, None, layout)
    before = sum(1 for _ in layer.kept)
    assert staged.shape == (2, 40, arch.hp.hidden * (1 + before) + 2 * layer.k)
    acc = torch.zeros_like(x)
    for a in layer.moe.experts.firsts:
        layer.load_slice(a)
        acc = layer.add_slice(staged, acc)
    assert torch.equal(layer.finish(x, staged, acc, None, layout), held)
    assert before == (0 if name == "nemotron_h_moe" else 1)


def test_a_sliced_window_holds_one_slice(tiny_model):
    """The window's weight block holds the layer's other tensors and one slice of its experts."""
    _, path = tiny_model("qwen3moe")
    arch = load_architecture(GGUFIndex(path))
    held = WindowExecutor(arch, 0, 1, "cpu", torch.float32)
    whole = held.weights.nbytes
    held.release()
    sliced = WindowExecutor(arch, 0, 1, "cpu", torch.float32, expert_slices=4)
    up = arch.gguf.tensors["blk.0.ffn_up_exps.weight"].shape
    one_expert = 3 * up[1] * up[2] * 4                                   # gate, up, down of one expert, float32
    assert whole - sliced.weights.nbytes == pytest.approx(3 * one_expert, abs=6 * 64)
    sliced.release()


@pytest.fixture(scope="module")
def big_experts(tmp_path_factory):
    from pipeline.gguf_io.registry import fetch_model
    from pipeline.tools.synthetic import Shape, write_synthetic_gguf

    path = tmp_path_factory.mktemp("big-experts") / "big-experts.gguf"
    return write_synthetic_gguf(path, Shape(**BIG_EXPERTS), fetch_model("smollm2-135m"))


def test_a_budget_below_one_layer_runs_in_expert_slices(tmp_path, big_experts):
    common = dict(model=str(big_experts), task="wikitext-2", corpus=str(HEAD40K), ctx=64, chunks=2)
    whole = run_pipeline(tmp_path / "whole", window_layers=0, **common)
    sliced = run_pipeline(tmp_path / "sliced", device_memory="900MiB", **common)
    assert [(w["first"], w["last"], w["expert_slices"]) for w in sliced["placement"]] == [(0, 1, 2), (1, 2, 2)]
    assert sliced["placement_text"] == "cpu [0..1) in 2 expert slices [1..2) in 2 expert slices"
    assert whole["placement"][0]["expert_slices"] == 1
    assert [w["mean_nll"] for w in sliced["per_window"]] == [w["mean_nll"] for w in whole["per_window"]]


def test_a_budget_below_one_expert_is_refused_naming_the_smallest_that_runs(tmp_path, big_experts):
    """The budget named runs the whole pass, the Score task's head and scratch included (they
    need more than the layer with one expert here)."""
    from pipeline import PerplexityRun

    common = dict(model=str(big_experts), task="wikitext-2", corpus=str(HEAD40K), ctx=512, chunks=2)
    run = PerplexityRun(device="cpu", run_root=str(tmp_path), device_memory="530MiB", **common)
    with pytest.raises(UserError, match=r"layer 0 on cpu needs .* but --device-memory is 0\.5 GiB, and one of its "
                                        r"128 experts at a time does not fit either; the smallest budget that works "
                                        r"is \d+ MiB") as refused:
        run.placement(check_memory=False)
    assert str(refused.value).endswith(" MiB, what the Score task (the LM head and its scratch) holds")
    smallest = int(str(refused.value).rsplit(" is ", 1)[1].split()[0])
    result = run_pipeline(tmp_path, device_memory=f"{smallest}MiB", **common)
    assert result["placement"][0]["expert_slices"] > 1
    with pytest.raises(UserError):
        PerplexityRun(device="cpu", run_root=str(tmp_path), device_memory=f"{smallest - 1}MiB",
                      **common).placement()


def test_a_sliced_layer_reads_each_expert_once_per_pass_and_resumes_between_slices(tmp_path, big_experts):
    """Slices outside, chunks inside: over 4 chunks each sliced window reads its layer's bytes of
    the file once (not once per chunk); killed in its second slice, the rerun computes the
    missing chunks of that slice only; the next window, killed while it removes its slices'
    arrays once its boundary is whole, computes and reads nothing more when run again; the
    numbers are the held layer's bit for bit."""
    import os
    import subprocess
    import sys

    from pipeline.paths import REPO_ROOT
    from pipeline.store import outputs

    common = dict(model=str(big_experts), task="wikitext-2", corpus=str(HEAD40K), ctx=64, chunks=4,
                  sequences_per_chunk=1)
    whole = run_pipeline(tmp_path / "whole", window_layers=0, **common)
    args = [f"--{k.replace('_', '-')}={v}" for k, v in common.items()] + ["--device-memory=900MiB", "--device=cpu"]
    cmd = [sys.executable, "-m", "luigi", "--module", "pipeline", "PerplexityRun", "--run-root",
           str(tmp_path / "sliced"), "--result-json", str(tmp_path / "sliced.json"), *args]
    fault = "chunk-written@LayerWindow [0..1) cpu experts 2/2#2"   # the second chunk of the second slice
    killed = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=900,
                            env={**os.environ, "LAYERCYCLE_FAULT": fault})
    assert killed.returncode < 0, killed.stderr                        # SIGKILL
    (partial,) = (tmp_path / "sliced" / "LayerWindow").glob("*.partial")
    assert (partial / "experts-0.done").exists() and not (partial / "experts-1.done").exists()

    # the rerun completes that window; killed in the next once its boundary is whole, while its
    # slices' arrays and marks are removed
    killed = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=900,
                            env={**os.environ, "LAYERCYCLE_FAULT": "staged-removed@LayerWindow [1..2)#1"})
    assert killed.returncode < 0, killed.stderr
    (partial,) = (tmp_path / "sliced" / "LayerWindow").glob("*.partial")
    assert (partial / "experts-1.done").exists() and not (partial / "staged.zarr").exists()

    done = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    sliced = json.loads((tmp_path / "sliced.json").read_text())
    assert [w["mean_nll"] for w in sliced["per_window"]] == [w["mean_nll"] for w in whole["per_window"]]
    gguf = GGUFIndex(big_experts)
    for window in sorted((tmp_path / "sliced" / "LayerWindow").iterdir()):
        manifest = outputs.read_manifest(window)
        layer = manifest["identity"]["layers"][0]
        file_bytes = sum(t.n_bytes for t in gguf.layer_tensors(layer))
        if layer == 0:   # resumed: the second slice and the rest of the layer only, 2 of 4 chunks of that slice
            assert manifest["chunks_computed"] == 4 and file_bytes / 2 < manifest["weight_file_bytes_read"] < file_bytes
        else:            # resumed with its boundary whole: nothing computed or read again
            assert manifest["chunks_computed"] == 0 and manifest["weight_file_bytes_read"] == 0
        assert not list(window.glob("experts-*")) and not (window / "staged.zarr").exists()


def test_slices_summed_under_another_budget_are_dropped_not_added_to(tmp_path, big_experts, monkeypatch):
    """A window that failed in its second of 2 slices is run again under a budget that slices it
    in 4 (the window's output folder is the same): what the 2-slice attempt summed is dropped,
    and the numbers are the held layer's bit for bit."""
    import luigi

    from pipeline import PerplexityRun
    from pipeline.model.sliced import SlicedLayer
    from pipeline.run.placement import Window

    common = dict(model=str(big_experts), task="wikitext-2", corpus=str(HEAD40K), ctx=64, chunks=2,
                  sequences_per_chunk=1)
    whole = run_pipeline(tmp_path / "whole", window_layers=0, **common)
    root, add = tmp_path / "sliced", SlicedLayer.add_slice
    calls = []

    def second_slice_fails(self, *chunks):
        calls.append(1)
        if len(calls) == 3:                  # slice 1's first chunk: slice 0 whole and marked
            raise UserError("the device ran out of memory")
        return add(self, *chunks)
    for slices, fails in ((2, True), (4, False)):
        windows = [Window("cpu", i, i + 1, slices) for i in range(2)]
        monkeypatch.setattr(PerplexityRun, "placement", lambda self, *args, windows=windows, **kwargs: windows)
        monkeypatch.setattr(SlicedLayer, "add_slice", second_slice_fails if fails else add)
        luigi.task_register.Register.clear_instance_cache()
        if fails:
            assert not luigi.build([PerplexityRun(device="cpu", run_root=str(root), **common)], local_scheduler=True,
                                   log_level="CRITICAL")
            (partial,) = (root / "LayerWindow").glob("*.partial")
            assert (partial / "experts-0.done").exists() and (partial / "experts-1.zarr").exists()
    sliced = run_pipeline(root, **common)
    assert [w["expert_slices"] for w in sliced["placement"]] == [4, 4]
    assert [w["mean_nll"] for w in sliced["per_window"]] == [w["mean_nll"] for w in whole["per_window"]]
