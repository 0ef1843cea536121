"""The benchmark's parsing and bookkeeping (the benchmark itself runs outside CI)."""
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.errors import UserError
from pipeline.tools.bench import _split
from pipeline.tools.llamacpp import parse_final_estimate

from .test_expert_slices import BIG_EXPERTS  # two layers larger than a 900 MiB budget in float32

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
        {"task": "LayerWindow", "seconds": {"load": 0.1, "read": 0.3, "compute": 4.0, "write": 0.4},
         "weight_read_wait_s": 0.6, "weight_load_s": 0.9, "weight_load_waited_s": 0.2},
        {"task": "Score", "seconds": {"load": 0.5, "read": 0.1, "compute": 2.0, "write": 0.1}},
    ]
    assert _split(manifests) == pytest.approx({"load": 1.0, "read_wait": 0.6, "load_hidden": 0.7, "compute": 4.3,
                                               "io": 1.0, "scoring": 2.7})


SYNTHETIC = {   # tiny shapes of the synthetic families (pipeline/tools/synthetic.py)
    "llama": dict(layers=3, hidden=256, ffn=512, heads=4, kv_heads=2),
    "qwen3moe": dict(family="qwen3moe", layers=3, hidden=256, heads=4, kv_heads=2, head_dim=64, quant="Q4_K",
                     experts=16, experts_used=4, expert_ffn=128),
    "qwen3moe-bf16": dict(family="qwen3moe", layers=3, hidden=256, heads=4, kv_heads=2, head_dim=64, quant="BF16",
                          experts=16, experts_used=4, expert_ffn=128),
    "nemotron_h_moe": dict(family="nemotron_h_moe", layers=6, hidden=256, ffn=512, heads=4, kv_heads=2, head_dim=64,
                           quant="Q4_K", experts=16, experts_used=4, expert_ffn=384, shared_ffn=256,
                           pattern="ME*EME", ssm_heads=8, ssm_head_dim=32, ssm_state=32, ssm_groups=2),
    "deepseek2": dict(family="deepseek2", layers=3, hidden=256, ffn=512, heads=4, head_dim=96, rope_dim=32,
                      value_dim=64, q_lora_rank=128, kv_lora_rank=256, dense_layers=1, quant="Q4_K", experts=16,
                      experts_used=4, expert_ffn=256, shared_ffn=256, expert_groups=4, groups_used=2),
    "deepseek32": dict(family="deepseek32", layers=3, hidden=256, ffn=512, heads=4, head_dim=96, rope_dim=32,
                       value_dim=64, q_lora_rank=128, kv_lora_rank=256, dense_layers=1, quant="Q4_K", experts=16,
                       experts_used=4, expert_ffn=256, shared_ffn=256, index_heads=4, index_dim=64, index_top_k=32),
    "kimi-linear": dict(family="kimi-linear", layers=4, hidden=256, ffn=512, heads=4, head_dim=96, rope_dim=32,
                        value_dim=64, kv_lora_rank=256, dense_layers=1, quant="Q4_K", experts=16, experts_used=4,
                        expert_ffn=256, shared_ffn=256, ssm_head_dim=64),
    "gemma4": dict(family="gemma4", layers=5, hidden=256, ffn=512, heads=4, kv_heads=2, head_dim=64,
                   global_head_dim=128, quant="Q4_K", sliding_window=16, attention_every=3, shared_kv_layers=2,
                   per_layer_dim=32),
    "minimax-m3": dict(family="minimax-m3", layers=3, hidden=256, ffn=512, heads=4, kv_heads=2, head_dim=64,
                       rope_dim=32, dense_layers=1, quant="Q4_K", experts=8, experts_used=2, expert_ffn=128,
                       shared_ffn=128, index_dim=64, index_top_k=2, index_block=16),
    "gpt-oss": dict(family="gpt-oss", layers=2, hidden=256, heads=4, kv_heads=2, head_dim=64, quant="Q4_K",
                    experts=8, experts_used=2, expert_ffn=128, sliding_window=16),
    "llama4": dict(family="llama4", layers=4, hidden=256, ffn=512, heads=4, kv_heads=2, head_dim=64, quant="Q4_K",
                   experts=4, experts_used=1, expert_ffn=128, shared_ffn=128, moe_every=2, sliding_window=8192,
                   context=131072),
    "qwen3next": dict(family="qwen3next", layers=4, hidden=256, heads=4, kv_heads=2, head_dim=64, rope_dim=16,
                      quant="Q4_K", experts=8, experts_used=2, expert_ffn=128, shared_ffn=128, ssm_heads=4,
                      ssm_head_dim=32, ssm_state=32, ssm_groups=2),
    # the final mixer averages gated streams, flatter than a norm: a sharper head
    "qwen4exp": dict(family="qwen4exp", layers=4, hidden=256, heads=4, kv_heads=2, head_dim=64, rope_dim=16,
                     quant="Q4_K", experts=8, experts_used=2, expert_ffn=128, shared_ffn=128, ssm_heads=4,
                     ssm_head_dim=32, ssm_state=32, ssm_groups=2, streams=4, streams_rank=32, ngram=3,
                     ngram_heads=2, index_heads=2, index_dim=64, index_top_k=16, index_block=8, head_gain=5.0),
    "deepseek4": dict(family="deepseek4", layers=4, hidden=256, heads=4, kv_heads=1, head_dim=64, rope_dim=16,
                      quant="Q4_K", experts=8, experts_used=2, expert_ffn=128, shared_ffn=128, streams=4,
                      sliding_window=16, pattern="CHSC", q_lora_rank=64, index_heads=2, index_dim=64, index_top_k=8,
                      out_groups=2, out_rank=32, hash_layers=1, swiglu_limit=7.0),
}


@pytest.mark.parametrize("family", SYNTHETIC)
def test_synthetic_model_runs_through_the_pipeline(tmp_path, model_path, family):
    """Each synthetic family is read by layercycle as its family and gives finite figures; its
    weights, dequantized by gguf-py, have mean 0 and std 1/sqrt(fan-in) (the head gain x that),
    so predictions are far from uniform: the mean NLL is about log(vocab) + gain^2 / 2."""
    from gguf import GGMLQuantizationType as Q
    from gguf import quants

    from pipeline.gguf_io.reader import GGUFIndex
    from pipeline.tools.synthetic import Shape, write_synthetic_gguf

    from .helpers import run_pipeline

    shape = Shape(**SYNTHETIC[family])
    path = write_synthetic_gguf(tmp_path / "synthetic.gguf", shape, model_path("smollm2-135m"))
    assert not (tmp_path / "synthetic.gguf.partial").exists()
    gguf = GGUFIndex(path)
    assert gguf.architecture == shape.family
    kinds = set()
    for name in ("blk.0.ffn_up_exps.weight", "blk.1.ffn_down_exps.weight", "blk.0.attn_q.weight",
                 "blk.0.attn_q_b.weight", "output.weight"):
        info = gguf.tensors.get(name)
        if info is None:
            continue
        values = quants.dequantize(gguf.raw(name), info.qtype)
        kinds.add(info.qtype)
        gain = shape.head_gain if name == "output.weight" else 1.0
        assert abs(values.mean()) < 0.05 * gain / np.sqrt(info.shape[-1])
        assert values.std() == pytest.approx(gain / np.sqrt(info.shape[-1]), rel=0.02)
    assert kinds <= {Q.Q4_0, Q.Q4_K, Q.BF16} and (shape.quant == "Q4_0" or Q[shape.quant] in kinds)
    r = run_pipeline(tmp_path / "run", model=str(path), ctx=64, chunks=2, window_layers=2)
    assert r["model"]["n_layers"] == shape.layers and r["placement"][0]["last"] == 2
    assert r["largest_window"]["weight_bytes"] > 0
    uniform = np.log(gguf.metadata["tokenizer.ggml.tokens"].count)
    assert uniform + 1 < r["mean_nll"] < uniform + shape.head_gain ** 2


def test_gpu_check_without_cuda_says_so_in_one_line(capsys):
    import torch

    from pipeline.tools import gpu_check

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: run python -m pipeline.gpu_check itself")
    assert gpu_check.main([]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["layercycle gpu_check: no CUDA device: this check needs a GPU machine"]


def test_gpu_check_flow_on_the_cpu(capsys, model_path, tmp_path, monkeypatch):
    """The check's passes, table and comparisons, with the CPU standing in for the GPU: a
    registered model, a synthetic MoE one and the KL pass between them."""
    from pipeline.tools import gpu_check, synthetic

    from .helpers import HEAD40K

    model_path("smollm2-135m")
    monkeypatch.setattr("pipeline.paths.MODELS_CACHE", tmp_path)     # the synthetic model is written here
    cfg = {"corpus": str(HEAD40K), "chunks": 2, "device": "cpu", "window_layers": 2,
           "compute_dtype": "bfloat16", "mean_nll_rel_tol": 0.003, "kl": ["smollm2-135m", "moe"],
           "models": {"smollm2-135m": {"ctx": 64},
                      "moe": {"ctx": 64, "sliced": {"device_memory": "900MiB", "compute_dtype": "float32"}}},
           "synthetic": {"moe": {**BIG_EXPERTS, "tokenizer_from": "smollm2-135m"}}}
    assert gpu_check.check_all(cfg)
    assert (tmp_path / "moe.gguf").is_file() and synthetic.Shape
    out = capsys.readouterr().out.splitlines()
    rows = [line.split(" | ") for line in out if line.startswith("| cpu ")]
    passes = ["| cpu float32 whole", "| cpu bfloat16 whole", "| cpu bfloat16 cycled", "| cpu bfloat16 split"]
    assert [r[0] for r in rows] == passes * 2 + ["| cpu float32 experts held", "| cpu float32 in 900MiB"]
    assert rows[3][1] == "cpu [0..7) [7..9) [9..11) [11..13) [13..15) [15..17) [17..19) [19..21) [21..22) [22..30)"
    assert rows[-1][1] == "cpu [0..1) in 2 expert slices [1..2) in 2 expert slices"
    assert all(r[-1] == "- |" for r in rows)  # no CUDA peak on the CPU
    verdicts = [line for line in out if line.endswith(("(ok)", "(FAIL)"))]
    assert [v.split(":")[0] for v in verdicts] == ["cycled vs whole (GPU)", "GPU vs CPU", "split vs CPU"] * 2 + \
        ["expert slices planned", "sliced vs held (GPU)", "KL pass vs own passes"]
    assert all(v.endswith("(ok)") for v in verdicts)
    summary = out[out.index("## Summary") + 2:]
    assert [line.split(" (")[0] for line in summary] == ["smollm2-135m: ok", "moe: ok", "KL smollm2-135m vs moe: ok"]


def test_gpu_check_matrix_flow_on_the_cpu(capsys, tiny_model, tmp_path, monkeypatch):
    """The matrix part of the check, the CPU standing in for the GPU: a member whose experts are
    sliced, one whose experts are held whole (no sliced pass), and a member without its file."""
    from pipeline.tools import gpu_check
    from pipeline.tools.architectures import MATRIX

    from .helpers import HEAD40K

    members = [m for m in MATRIX if m.name in ("qwen3moe", "glm-dsa")]
    for m in members:
        (tmp_path / f"{m.name}.gguf").symlink_to(tiny_model(m.name)[1])
    monkeypatch.setattr(gpu_check, "MATRIX", members)
    config = tmp_path / "gpu_check.toml"      # the registered models' part, left out by --matrix-only
    config.write_text(f'corpus = "{HEAD40K}"\ndevice = "cpu"\ncompute_dtype = "bfloat16"\nkl = ["none", "none"]\n'
                      f'[models]\n"no-such-model" = {{ ctx = 64 }}\n[matrix]\nfolder = "{tmp_path}"\nchunks = 2\n'
                      f'sequences_per_chunk = 2\ncompute_dtype = "float32"\nmean_nll_nats = 0.001\n')
    assert gpu_check.main(["--config", str(config), "--matrix-only"]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = {row[0][2:]: row for row in (line.split(" | ") for line in out) if row[2:3] == ["cpu float32"]}
    assert list(rows) == ["qwen3moe", "glm-dsa"]
    assert rows["qwen3moe"][-2].startswith("cycled == whole, sliced == whole, whole ")
    assert rows["glm-dsa"][7] == "-" and rows["glm-dsa"][-2].startswith("cycled == whole, whole ")
    assert all(r[-1] == "ok |" for r in rows.values())
    assert [line.split(" (")[0] for line in out[out.index("## Summary") + 2:]] == [
        "matrix qwen3moe: ok", "matrix glm-dsa: ok"]
    monkeypatch.setattr(gpu_check, "MATRIX", [m for m in MATRIX if m.name == "qwen3"])
    assert gpu_check.main(["--config", str(config), "--matrix-only"]) == 1
    assert capsys.readouterr().err.startswith(f"layercycle gpu_check: {tmp_path}/qwen3.gguf is missing: "
                                              "`python -m tests.hf_models ")


def test_a_llama_perplexity_run_that_lost_its_final_estimate_is_run_again(monkeypatch):
    import subprocess

    from pipeline.tools import bench

    outputs = iter(["perplexity: calculating perplexity over 4 chunks", LLAMA_OUTPUT])
    monkeypatch.setattr(bench, "run_sampled", lambda cmd, **kw: (
        subprocess.CompletedProcess(cmd, 0, next(outputs), ""), 2.0, 100.0))
    cfg = {"corpus": "c.txt", "ctx": 512, "threads": 2, "chunks": 4}
    row = bench.llama_once(Path("llama-perplexity"), Path("m.gguf"), cfg)
    assert row.ppl == 22.8855 and next(outputs, None) is None
    monkeypatch.setattr(bench, "run_sampled", lambda cmd, **kw: (subprocess.CompletedProcess(cmd, 0, "", ""), 2.0, 1.0))
    with pytest.raises(UserError, match="printed no final estimate"):   # not for ever
        bench.llama_once(Path("llama-perplexity"), Path("m.gguf"), cfg)


def test_runs_take_turns_and_the_median_run_is_quoted(monkeypatch):
    from pipeline.tools import bench

    calls = []
    walls = iter([5.0, 9.0, 1.0, 7.0, 3.0, 8.0])

    def llama_once(binary, model, cfg):
        calls.append("llama")
        return bench.Row("llama-perplexity", None, next(walls), 0.0, 1.0)

    def layercycle_once(alias, model, window, cfg, numerics):
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


def test_moe_chunk_bench_on_a_tiny_model(capsys, model_path, tmp_path, monkeypatch):
    """The MoE chunk-size benchmark's table and time split, on a tiny synthetic MoE model; the
    split's classes hold what a window runs (its matrix products counted as GEMMs, in seconds: a
    share can round to 0% on a loaded machine)."""
    from pipeline.gguf_io.reader import open_gguf
    from pipeline.model.arch import load_architecture
    from pipeline.tools.moe_bench import bench_moe_chunks, time_split
    from pipeline.tools.synthetic import synthetic_or_registered

    model_path("smollm2-135m")
    monkeypatch.setattr("pipeline.paths.MODELS_CACHE", tmp_path)
    synthetic = {"moe": {**SYNTHETIC["qwen3moe"], "tokenizer_from": "smollm2-135m"}}
    bench_moe_chunks({"model": "moe", "layers": [0, 2], "compute_dtype": "float32", "ctx": 32, "chunk_sizes": [1, 2],
                      "expert_slices": 2, "repetitions": 1, "profile_chunk": 2, "synthetic": synthetic})
    out = capsys.readouterr().out.splitlines()
    rows = [line.split(" | ") for line in out if line.startswith("| 1 ") or line.startswith("| 2 ")]
    assert [r[0] for r in rows] == ["| 1", "| 2"] and all(float(r[1]) > 0 and float(r[3]) > 0 for r in rows)
    split = next(line for line in out if line.startswith("One chunk of 2 sequences"))
    shares = {part.split()[0]: int(part.split()[-1].rstrip("%")) for part in split.split("; ")[1].split(", ")}
    assert list(shares) == ["GEMMs", "attention", "routing", "other"] and abs(sum(shares.values()) - 100) <= 3
    arch = load_architecture(open_gguf(str(synthetic_or_registered("moe", synthetic))))
    seconds = time_split(arch, 0, 2, torch.float32, 2, 32)
    assert seconds["GEMMs"] > 0 and seconds["routing"] > 0 and seconds["attention"] > 0


def test_every_synthetic_shape_in_the_settings_can_be_written():
    """The [synthetic.*] tables of the benchmark and GPU-check settings are shapes the writer
    takes (rows of whole Q4_0 blocks, a pattern per layer), checked without writing them."""
    import tomllib

    from pipeline.paths import CONFIGS
    from pipeline.tools.synthetic import Shape, check_shape

    tables = {}
    for path in [CONFIGS / "gpu_check.toml", *sorted((CONFIGS / "bench").glob("*.toml"))]:
        tables |= tomllib.loads(path.read_text()).get("synthetic", {})
    for path in sorted((CONFIGS / "quantize").glob("*.toml")):   # the bases of quantized sets
        tables[path.stem] = tomllib.loads(path.read_text())["base"]
    assert {"synthetic-moe", "synthetic-hybrid", "synthetic-qwen3-30b-a3b", "synthetic-nemotron-h-30b-a3b",
            "synthetic-deepseek-v3-mla-layer", "synthetic-7b", "overnight-moe"} <= set(tables)
    for table in tables.values():
        check_shape(Shape(**{k: v for k, v in table.items() if k != "tokenizer_from"}))
    with pytest.raises(UserError, match="rows of 464 values, no multiple of 32"):
        check_shape(Shape(**{**SYNTHETIC["nemotron_h_moe"], "expert_ffn": 464}))


def test_quantizations_of_a_bfloat16_synthetic_base_diverge_as_the_bits_fall(tmp_path, model_path):
    """The overnight sweep in small: a bfloat16 synthetic MoE as the KL base and gguf-py's Q8_0
    and Q4_0 of its matrices; the KL-divergence grows as the bits fall, from above zero."""
    from gguf import GGMLQuantizationType as Q
    from gguf import quants

    from pipeline.tools.synthetic import Shape, write_synthetic_gguf

    from .helpers import HEAD40K, run_pipeline
    from .tiny_gguf import rewrite_gguf

    base = write_synthetic_gguf(tmp_path / "base-bf16.gguf", Shape(**SYNTHETIC["qwen3moe-bf16"]),
                                model_path("smollm2-135m"))

    def quantized(qtype):
        def to(name, t, data):
            return (quants.quantize(quants.dequantize(data, t), qtype), qtype) if t == Q.BF16 else (data, t)
        return rewrite_gguf(base, tmp_path / f"{qtype.name}.gguf", to)

    common = dict(kl_base=str(base), task="wikitext-2", corpus=str(HEAD40K), ctx=64, chunks=4)
    kld = {q.name: run_pipeline(tmp_path / "runs", model=str(quantized(q)), **common)["kld"]["mean"]
           for q in (Q.Q8_0, Q.Q4_0)}
    assert 0 < kld["Q8_0"] < kld["Q4_0"]


@pytest.mark.parametrize("family, ctx", [("gpt-oss", 128), ("llama4", 9216), ("qwen3next", 128),
                                         ("deepseek32", 128), ("kimi-linear", 128), ("gemma4", 128),
                                         ("minimax-m3", 128), ("qwen4exp", 128), ("deepseek4", 256)])
def test_gpu_check_forms_on_the_cpu(capsys, model_path, tmp_path, monkeypatch, family, ctx):
    """The GPU check's attention and FFN forms (sinks on a sliding window, chunked attention past
    8192 tokens with NoPE layers under the temperature, Gated DeltaNet, DeepSeek Sparse Attention
    past its top-k, Kimi Delta Attention beside latent attention without RoPE, Gemma 4's K/V carried
    across windows and per-layer inputs from the token ids, MiniMax Sparse Attention's blocks,
    Qwen4-Exp's hyper-connections, query-sparse attention and n-gram embedding, DeepSeek-V4's
    compressed entries past 128 keys and hash-routed layer), with the CPU standing in for the GPU:
    cycled == whole bit for bit, bfloat16 and the split pass near float32."""
    from pipeline.tools import gpu_check

    from .helpers import HEAD40K

    model_path("smollm2-135m")
    monkeypatch.setattr("pipeline.paths.MODELS_CACHE", tmp_path)
    twice = tmp_path / "head40k-twice.txt"   # room for 2 x 9216 tokens, as the llama-cpp method asks
    twice.write_text(HEAD40K.read_text() * 2)
    long = {"chunks": 1, "corpus": str(twice)} if ctx > 8192 else {}
    # past 8192 tokens, attention and the head over 49,152 entries are the cost: two heads of 32, width 64
    shape = SYNTHETIC[family] | (dict(hidden=64, ffn=128, heads=2, kv_heads=1, head_dim=32) if long else {})
    cfg = {"corpus": str(HEAD40K), "chunks": 2, "device": "cpu", "window_layers": 1, "compute_dtype": "bfloat16",
           "mean_nll_rel_tol": 0.01, "models": {family: {"ctx": ctx, **long}},
           "synthetic": {family: {**shape, "tokenizer_from": "smollm2-135m"}}}
    ok, whole = gpu_check.check_model(family, cfg)
    out = capsys.readouterr().out
    assert ok, out
    assert whole["tokens_scored"] == (ctx - ctx // 2 - 1) * (1 if long else 2)
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| cpu ")]
    assert [r[0] for r in rows] == ["| cpu float32 whole", "| cpu bfloat16 whole", "| cpu bfloat16 cycled",
                                    "| cpu bfloat16 split"]
    assert all(int(r[5]) > 0 for r in rows)   # the budget each pass was planned for


def test_the_synthetic_command_writes_a_named_model_once(tmp_path, monkeypatch, capsys, model_path):
    from pipeline.gguf_io.reader import GGUFIndex
    from pipeline.tools import synthetic

    model_path("smollm2-135m")
    monkeypatch.setattr("pipeline.paths.MODELS_CACHE", tmp_path)
    config = tmp_path / "synthetic.toml"
    config.write_text('[synthetic.tiny]\nfamily = "qwen3moe"\nlayers = 1\nhidden = 64\nheads = 2\nkv_heads = 1\n'
                      'head_dim = 32\nexperts = 4\nexperts_used = 2\nexpert_ffn = 64\n'
                      'tokenizer_from = "smollm2-135m"\n')
    assert synthetic.main(["--config", str(config), "tiny"]) == 0
    path = Path(capsys.readouterr().out.strip())
    assert path == tmp_path / "tiny.gguf" and GGUFIndex(path).architecture == "qwen3moe"
    written = path.stat().st_mtime_ns
    assert synthetic.main(["--config", str(config), "tiny"]) == 0 and path.stat().st_mtime_ns == written
    assert synthetic.main(["--config", str(config), "other"]) == 1
    assert "has no [synthetic.other] (it has: tiny)" in capsys.readouterr().err


def test_a_config_takes_its_bases_keys_where_it_sets_none():
    from pipeline.paths import CONFIGS
    from pipeline.tools.bench import load_config

    cfg = load_config(CONFIGS / "bench" / "30b-a3b-llama-cpp-numerics.toml")
    assert cfg["models"] == ["synthetic-qwen3-30b-a3b"] and cfg["compute_dtype"] == "float32"
    assert cfg["device_memory"] == "12GiB" and "synthetic-qwen3-30b-a3b" in cfg["synthetic"] and "base" not in cfg
    assert cfg["corpus"].endswith("wikitext-2-test.head40k.txt")


def test_the_plot_draws_a_line_for_each_numerics_mode(tmp_path):
    """Two rows of one window size (a numerics axis) plot as two lines, not one sorted by row."""
    from pipeline.tools.bench import Row, plot

    rows = [Row("llama-perplexity", None, 10.0, 50.0, 20.0)]
    rows += [Row(f"layercycle {w} {n}", w, 5.0, speed, 20.0, window_rss_mb=100.0 * (w or 30), numerics=n)
             for w, n, speed in [(4, "exact", 90.0), (4, "llama-cpp", 80.0), (0, "exact", 100.0),
                                 (0, "llama-cpp", 88.0)]]
    path = tmp_path / "plot.png"
    plot({"smollm2-135m": rows}, {"smollm2-135m": 30}, path)
    assert path.stat().st_size > 1000


def test_choice_task_bench_sets_each_command_beside_llama_perplexitys(capsys, tmp_path, monkeypatch):
    """A row per model and task: both sides' wall times, their ratio, accuracies (llama-perplexity's
    read off its last line) and the positions each computes."""
    from pipeline.paths import REPO_ROOT
    from pipeline.tools import choice_bench

    fake = tmp_path / "llama-perplexity"      # prints llama-perplexity's running HellaSwag lines
    fake.write_text("#!/bin/sh\nprintf '1\\t100.00000000%%\\t[20.6549%%, 100.0000%%]\\n"
                    "2\\t50.00000000%%\\t[9.4531%%, 90.5469%%]\\n'\n")
    fake.chmod(0o755)
    monkeypatch.setattr(choice_bench, "llama_perplexity", lambda version: fake)
    monkeypatch.setattr(choice_bench, "dataset_file", lambda name: REPO_ROOT / "data/corpora/hellaswag-val.head48.txt")
    choice_bench.bench_choice_tasks({"models": ["smollm2-135m"], "tasks": {"hellaswag": 4}, "compute_dtype": "float32",
                                     "threads": 2, "llama_ctx": 512, "repetitions": 1, "llama_cpp_python": "0.3.36"})
    cells = capsys.readouterr().out.splitlines()[-1].strip("| ").split(" | ")
    model, task, tasks, llama_s, ours_s, ratio, llama_accuracy, accuracy, computed, theirs = cells
    assert (model, task, tasks, llama_accuracy) == ("smollm2-135m", "hellaswag", "4", "50.0000")
    assert float(ratio) == pytest.approx(float(llama_s) / float(ours_s), abs=0.01)
    assert accuracy == "25.0000"              # SmolLM2's first 4 of these tasks (tests/test_hellaswag.py's LLAMA_16)
    assert int(computed.replace(",", "")) >= int(theirs.replace(",", "")) > 0
