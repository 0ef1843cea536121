"""Memory preflight: a placement whose window cannot fit its device is refused before the pass
starts, with the window size that does fit."""
import json
import re

import luigi
import pytest
import torch

from pipeline.errors import UserError
from pipeline.model.arch import load_architecture
from pipeline.model.arch.family import KERNEL_WORKSPACE_BYTES
from pipeline.run import preflight
from pipeline.run.placement import Window


def test_largest_fitting_window_looks_at_every_position():
    per_layer = [1, 5, 1, 1, 1]
    assert preflight.largest_fitting_window(per_layer, fixed=1, budget=9) == 4   # 1+5+1+1 (+1) = 9
    assert preflight.largest_fitting_window(per_layer, fixed=1, budget=8) == 3   # 5+1+1 (+1) = 8
    assert preflight.largest_fitting_window(per_layer, fixed=1, budget=7) == 2   # 5+1 (+1) = 7
    assert preflight.largest_fitting_window(per_layer, fixed=1, budget=5) == 0   # the 5 never fits


def test_a_cgroup_leaves_its_limit_less_what_is_charged_but_inactive_page_cache(monkeypatch, tmp_path):
    """Read-ahead fills the page cache on purpose and the cgroup is charged for it; the kernel
    reclaims inactive file pages before an allocation fails, so a rerun is not refused for them."""
    from pipeline.run import preflight

    (tmp_path / "memory.max").write_text("8589934592\n")                  # 8 GiB
    (tmp_path / "memory.current").write_text(f"{7 * 2**30}\n")            # 7 GiB charged ...
    (tmp_path / "memory.stat").write_text(f"anon {2 * 2**30}\nfile {5 * 2**30}\nactive_file {2**30}\n"
                                          f"inactive_file {4 * 2**30}\n")   # ... 4 of them inactive cache
    monkeypatch.setattr(preflight, "CGROUP", tmp_path)
    assert preflight.cgroup_free() == 5 * 2**30
    assert preflight.available_bytes("cpu") <= 5 * 2**30               # MemAvailable capped by it
    (tmp_path / "memory.max").write_text("max\n")                          # no limit
    assert preflight.cgroup_free() is None and preflight.cgroup_limit() is None


def test_refusal_names_the_need_and_the_window_that_fits():
    windows = [Window("cpu", 0, 4)]
    with pytest.raises(UserError, match=r"need about 4\.5 GiB .* but 3\.0 GiB are available; --window-layers 2 fits"):
        preflight.check_windows_fit(windows, [2 ** 30] * 4, 2 ** 29, {"cpu": "float32"}, {"cpu": 3 * 2 ** 30})


def a_third_of_the_trunk_fits(run, monkeypatch) -> int:
    """The CPU's memory, from now on, holds a third of the run's float32 trunk (of how many layers)."""
    windows = run.placement()                                     # fits this machine
    s = run.spec()
    per_layer = [preflight.layer_weight_bytes(s.gguf, i, torch.float32) for i in range(windows[-1].last)]
    n_head = load_architecture(s.gguf).hp.n_head
    fixed = preflight.RUNTIME_BYTES + preflight.activation_bytes(s.gguf, run.sequences_per_chunk, s.method.ctx, n_head)
    monkeypatch.setattr(preflight, "available_bytes", lambda device: fixed + sum(per_layer) // 3)
    monkeypatch.setattr(preflight, "check_heads_fit", lambda *args: None)  # the head has its own test
    return len(per_layer)


def test_whole_trunk_refused_before_it_starts_and_the_advice_runs(monkeypatch, tmp_path):
    from pipeline import PerplexityRun

    run = PerplexityRun(model="smollm2-135m", window_layers=0, device="cpu", run_root=str(tmp_path))
    n_layers = a_third_of_the_trunk_fits(run, monkeypatch)
    with pytest.raises(UserError, match="--window-layers") as refused:
        run.placement()
    advised = int(re.search(r"--window-layers (\d+) fits", str(refused.value)).group(1))
    assert 0 < advised < n_layers
    assert PerplexityRun(model="smollm2-135m", window_layers=advised, device="cpu", run_root=str(tmp_path)).placement()
    assert not list(tmp_path.iterdir())                           # refused before any task ran


def test_the_command_refuses_it_in_one_line(monkeypatch, tmp_path, caplog):
    """Through Luigi, as `luigi --module pipeline PerplexityRun` runs it: the run fails with the
    preflight's line and no task runs."""
    from pipeline import PerplexityRun

    run = PerplexityRun(model="smollm2-135m", window_layers=0, device="cpu", run_root=str(tmp_path))
    a_third_of_the_trunk_fits(run, monkeypatch)
    done = luigi.build([run], local_scheduler=True, detailed_summary=True)
    assert done.status.name == "FAILED"
    lines = [r.getMessage() for r in caplog.records if "layercycle:" in r.getMessage()]
    assert len(lines) == 1 and re.search(r"need about .* GiB are available; --window-layers \d+ fits", lines[0])
    assert not any(r.exc_info for r in caplog.records)
    assert not list(tmp_path.iterdir())


def test_a_head_that_cannot_fit_is_refused_before_the_pass(model_path):
    from pipeline.gguf_io.reader import GGUFIndex

    gguf = GGUFIndex(model_path("gemma3-270m"))  # tied head: token_embd, 262144 x 640 (0.625 GiB);
    # with the runtime's 0.5 GiB and the 0.31 GiB of a logits block and a widened head slice, 1.4 GiB
    head = 4 * 262144 * 640
    preflight.check_heads_fit([(gguf, "float32")], "cpu", preflight.RUNTIME_BYTES + head + 2 ** 30)
    with pytest.raises(UserError, match=r"the LM head \(token_embd.weight\) on cpu needs about 1\.4 GiB "
                                        r"\(0\.6 GiB of float32 weights\) .* --compute-dtype bfloat16 halves it"):
        preflight.check_heads_fit([(gguf, "float32")], "cpu", head)
    # a KL comparison's Score task holds both heads: 1.25 GiB of weights, 2.1 GiB in all
    both = [(gguf, "float32"), (gguf, "float32")]
    preflight.check_heads_fit(both, "cpu", preflight.RUNTIME_BYTES + 2 * head + 2 ** 30)
    with pytest.raises(UserError, match=r"the LM heads of the model and its KL base on cpu need about 2\.1 GiB "
                                        r"\(1\.2 GiB of float32 weights\)"):
        preflight.check_heads_fit(both, "cpu", preflight.RUNTIME_BYTES + 2 * head)
    # a bfloat16 run against a float32 base: 0.3 + 0.6 GiB of weights, 1.8 GiB in all
    mixed = [(gguf, "bfloat16"), (gguf, "float32")]
    preflight.check_heads_fit(mixed, "cpu", preflight.RUNTIME_BYTES + head * 3 // 2 + 2 ** 30)
    with pytest.raises(UserError, match=r"need about 1\.8 GiB \(0\.9 GiB of bfloat16/float32 weights\)"):
        preflight.check_heads_fit(mixed, "cpu", preflight.RUNTIME_BYTES + head * 3 // 2)


def test_a_mask_with_grouped_heads_counts_the_math_kernels_scores_on_cuda_only(model_path):
    """Gemma-3's sliding layers (span 512, 4 heads over 1 KV head) at ctx 1024: on CUDA SDPA's
    flash and memory-efficient kernels take no boolean mask with grouped-query heads, and its
    math kernel holds three [batch, heads, ctx, ctx] float32 tensors; the CPU kernel holds none
    (measured: test_activation_memory.py); at ctx 512 no layer is masked on either."""
    from pipeline.gguf_io.reader import GGUFIndex

    gguf = GGUFIndex(model_path("gemma3-270m"))
    n_head = load_architecture(gguf).hp.n_head
    act = lambda ctx, device: preflight.activation_bytes(gguf, 4, ctx, n_head, device)   # noqa: E731
    assert act(1024, "cuda") - act(1024, "cpu") == 3 * 4 * 4 * n_head * 1024 * 1024
    assert act(512, "cuda") == act(512, "cpu")


def test_attention_sinks_count_three_score_tensors(tiny_model):
    """gpt-oss's sink attention holds its scores, masked scores with the sink column and their
    softmax at any length: three score tensors, also where no layer's window is shorter than ctx."""
    from pipeline.gguf_io.reader import GGUFIndex

    gguf = GGUFIndex(tiny_model("gpt-oss")[1])                     # sliding window 32
    act = lambda ctx: preflight.activation_bytes(gguf, 4, ctx, 4) - KERNEL_WORKSPACE_BYTES   # noqa: E731
    assert act(32) - 2 * act(16) == 2 * 3 * 4 * 4 * 4 * 16 * 16     # = (4 - 2) x 3 scores(16)


def test_window_tasks_hold_flat_memory_below_the_whole_trunk(tmp_path):
    """Each window task's peak RSS (its own, in the one worker process a user's run has) is the
    same from the first window to the last and well below the whole trunk's."""
    from .helpers import HEAD40K, luigi_cli

    def window_peaks(window_layers: int) -> list[float]:
        root = tmp_path / str(window_layers)
        done = luigi_cli("--task", "wikitext-2", "--corpus", str(HEAD40K), "--chunks", "4",
                         "--window-layers", str(window_layers), run_root=root)
        assert done.returncode == 0, done.stderr
        manifests = [json.loads(p.read_text()) for p in (root / "LayerWindow").glob("*/manifest.json")]
        return [m["peak_rss_mb"] for m in sorted(manifests, key=lambda m: m["identity"]["layers"])]

    cycled, (whole,) = window_peaks(5), window_peaks(0)
    assert len(cycled) == 6
    assert max(cycled) < 1.1 * min(cycled)
    assert max(cycled) < 0.75 * whole


def test_device_memory_sizes_the_windows_and_the_numbers_stay(tmp_path):
    """--device-memory 1.5GiB on the CPU (a smaller device, emulated): Qwen2.5-0.5B's 24 float32
    layers (60 MB each) no longer fit one window beside the runtime, so auto-sized windows cycle,
    each within the budget, and every sequence's NLL is the whole trunk's, bit for bit."""
    from .helpers import HEAD40K, run_pipeline

    common = dict(model="qwen2.5-0.5b", task="wikitext-2", corpus=str(HEAD40K), ctx=128, chunks=2)
    whole = run_pipeline(tmp_path / "whole", window_layers=0, **common)
    capped = run_pipeline(tmp_path / "capped", device_memory="1.5GiB", **common)
    assert len(capped["placement"]) > 1 and capped["placement"][0]["first"] == 0
    assert [w["mean_nll"] for w in capped["per_window"]] == [w["mean_nll"] for w in whole["per_window"]]
