"""The architectures on tiny random models converted by llama.cpp's converter (tests/hf_models.py):
logits against the Hugging Face model they came from, recurrent state reset per sequence,
quantized expert tensors, and the weight bytes a window holds. What every family's passes must
give (cycled, split, sliced, sharded, resumed, bfloat16) is the conformance matrix's
(test_conformance.py)."""
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import quants

from pipeline.gguf_io.reader import GGUFIndex
from pipeline.model.arch import load_architecture
from pipeline.model.executor import WindowExecutor

from .helpers import forward, random_ids, run_pipeline
from .tiny_gguf import rewrite_gguf

ARCHS = ["qwen2", "qwen3", "qwen3moe", "mixtral", "qwen3next", "qwen35", "qwen35moe", "nemotron_h", "nemotron_h_moe",
         "deepseek2", "deepseek2_lite", "glm4moe", "mistral3", "mistral4", "qwen3vl", "qwen3vlmoe",
         "gpt-oss", "minimax-m2", "llama4", "ernie4_5-moe", "smollm3", "olmo2", "olmo3", "seed_oss",
         "qwen2moe", "glm4", "exaone4", "olmoe", "gemma2", "granite", "granitemoe",
         "phi3", "phi3_longrope", "command-r", "cohere2", "lfm2", "lfm2moe",
         "granitehybrid", "falcon-h1", "gemma4", "gemma4_moe", "deepseek32",
         "glm-dsa", "cohere2moe", "afmoe", "mimo2", "kimi-linear", "step35", "minimax-m3", "qwen4exp", "gemma3",
         "bailingmoe3", "dots1", "dots3note", "hunyuan-moe", "hy_v3", "hy_v4", "qwen2vl", "apertus",
         "laguna", "laguna_m1", "mamba", "falcon_mamba", "jamba", "minimax-01", "exaone-moe", "muse-glimmer",
         "glm5next"]
# the largest open families, also read from Q8_0 files
QUANTIZED = ["deepseek2", "glm4moe", "mistral3", "qwen3vlmoe", "gpt-oss", "minimax-m2", "llama4",
             "ernie4_5-moe", "olmo3", "qwen2moe", "gemma2", "granitemoe"]
HYBRIDS = ["qwen3next", "qwen35", "nemotron_h", "lfm2", "granitehybrid", "falcon-h1", "kimi-linear", "qwen4exp",
           "bailingmoe3", "mamba", "jamba", "minimax-01", "glm5next"]
EXPECTED_ARCH = {"gemma4_moe": "gemma4", "mixtral": "llama", "falcon_mamba": "mamba",
                 "deepseek2_lite": "deepseek2", "olmo3": "olmo2", "phi3_longrope": "phi3",
                 "laguna_m1": "laguna", "glm5next": "glm5-next"}
# Both sides compute float32 over the same float32 weights; they differ by rounding order.
# Measured max |diff| on logits of magnitude ~10: <= 5e-5 for attention/Mamba2 models, up to
# 1.7e-3 for Gated DeltaNet ones, whose own float32 and float64 runs differ by as much (the
# decays and L2 norms amplify rounding). A wrong layout, sign or norm offset moves logits by > 0.1.
# gpt-oss: up to 1.6e-4, its sinks' softmax and clamped experts summed in another order.
# falcon-h1: 2.0e-4 at one position, where transformers' float64 forward is 1.0e-4 from ours in
# float64 (its own float32 is 6e-5 from it) and llama-perplexity's PPL is 2e-7 nats from ours.
# gemma4: 2.4e-4, growing with the position; transformers' float64 forward (which still norms in
# float32) is 1.3e-4 from its float32 one and 2.3e-4 from ours in float64; llama-perplexity is
# 2.2e-5 nats from ours with its float16 GELU table emulated (ARCHITECTURES.md).
# kimi-linear: 1.9e-4; transformers L2-norms Q and K with eps 1e-6, llama.cpp with the file's RMS eps
# (1e-5, as we do): with that eps, 1.1e-4.
# minimax-01: 7.2e-4, spread over the positions; transformers' own float32 forward is 6.8e-4 from its
# float64 one, ours 6.8e-4 from ours in float64 (the lightning layers' undecayed sums), and in float64
# each layer's output is within 6e-6 of transformers' (which norms in float32 and rounds its decays and
# slopes to float32 otherwise than llama.cpp); llama-perplexity's PPL is 3e-7 nats from ours.
ATOL = {"gemma4": 4e-4, "kimi-linear": 4e-4, "qwen3next": 5e-3, "qwen35": 5e-3, "qwen35moe": 5e-3, "gpt-oss": 4e-4,
        "falcon-h1": 4e-4, "minimax-01": 1.5e-3}
DEFAULT_ATOL = 2e-4


@pytest.mark.parametrize("name", ARCHS)
def test_logits_match_transformers(name, tiny_model):
    model, path = tiny_model(name)
    assert GGUFIndex(path).architecture == EXPECTED_ARCH.get(name, name)
    ids = random_ids()
    ours = forward(path, ids)
    with torch.inference_mode():
        ref = model(ids).logits
    assert ref.std() > 1.5  # far from uniform, or a broken layer could hide under ln(vocab)
    assert (ours - ref).abs().max().item() < ATOL.get(name, DEFAULT_ATOL)
    assert (ours.argmax(-1) == ref.argmax(-1)).all()


def nll_without_and_with_reset(path, n_sequences: int) -> tuple[float, float]:
    """Mean NLL over `n_sequences` sequences, with the pass's per-sequence state reset and with
    an executor that carries each recurrent layer's state from one window into the next."""
    arch = load_architecture(GGUFIndex(path))
    ids = random_ids(n_sequences, 64, seed=2)
    window = WindowExecutor(arch, 0, arch.hp.n_layers, "cpu", torch.float32)
    head = arch.load_head("cpu", torch.float32)
    embedded = arch.embed(ids, "cpu", torch.float32)
    carried: dict = {}
    runs = {"reset": window(embedded, ids=ids),
            "carried": torch.cat([window(embedded[i:i + 1], state=carried, ids=ids[i:i + 1])
                                  for i in range(n_sequences)])}
    nll = {k: torch.nn.functional.cross_entropy(head(h[:, :-1]).flatten(0, 1), ids[:, 1:].flatten()).item()
           for k, h in runs.items()}
    return nll["reset"], nll["carried"]


@pytest.mark.parametrize("name", HYBRIDS)
def test_not_resetting_recurrent_state_changes_the_number(name, tiny_model):
    _, path = tiny_model(name)
    reset, carried = nll_without_and_with_reset(path, n_sequences=4)
    assert abs(carried - reset) > 1e-3 * reset


@pytest.mark.parametrize("name", HYBRIDS)
def test_over_one_corpus_window_reset_and_carry_coincide(name, tiny_model):
    # pinned: the test above is armed only because it spans several sequences
    _, path = tiny_model(name)
    reset, carried = nll_without_and_with_reset(path, n_sequences=1)
    assert carried == reset


def dequantized_twin(src, dst):
    """The same GGUF with every quantized tensor stored as gguf-py's float32 dequantization."""
    def to_f32(name, qtype, data):
        if qtype in (Q.F32, Q.F16):
            return data, qtype
        return quants.dequantize(data, qtype).astype(np.float32), Q.F32
    return rewrite_gguf(src, dst, to_f32)


# the first bytes of each block of random experts: small scales, so that the values stay modest
BLOCK_HEADERS = {Q.Q4_K: np.array([5e-4, 5e-4], dtype=np.float16).view(np.uint8),   # d, dmin
                 Q.MXFP4: np.array([120], dtype=np.uint8)}                              # e8m0 exponent: 2^-8


def random_experts(src, dst, qtype=Q.Q4_K):
    """Expert tensors replaced by random `qtype` blocks (BLOCK_HEADERS' scales), the rest unchanged."""
    rng = np.random.default_rng(0)
    block, size = quants.GGML_QUANT_SIZES[qtype]
    header = BLOCK_HEADERS[qtype]

    def to_random(name, q, data):
        if "_exps.weight" not in name:
            return data, q
        raw = rng.integers(0, 256, (*data.shape[:-1], data.shape[-1] // block * size), dtype=np.uint8)
        raw.reshape(-1, size)[:, :header.size] = header
        return raw, qtype
    return rewrite_gguf(src, dst, to_random)


@pytest.mark.parametrize("name", ["qwen3moe", *QUANTIZED])
def test_q8_0_files_equal_their_gguf_py_dequantization(name, tiny_model, tmp_path):
    _, path = tiny_model(name, "q8_0")
    index = GGUFIndex(path)
    experts = {t.qtype for n, t in index.tensors.items() if n.endswith("_exps.weight")}
    assert Q.Q8_0 in {t.qtype for n, t in index.tensors.items() if n.startswith("blk.")} and experts <= {Q.Q8_0}
    ids = random_ids()
    assert torch.equal(forward(path, ids), forward(dequantized_twin(path, tmp_path / "twin.gguf"), ids))


def test_q4_k_experts_equal_their_gguf_py_dequantization(tiny_model, tmp_path):
    _, path = tiny_model("qwen3moe_wide")
    q4k = random_experts(path, tmp_path / "q4k.gguf")
    assert GGUFIndex(q4k).tensors["blk.1.ffn_down_exps.weight"].qtype == Q.Q4_K
    ids = random_ids()
    logits = forward(q4k, ids)
    assert torch.isfinite(logits).all() and not torch.equal(logits, forward(path, ids))
    assert torch.equal(logits, forward(dequantized_twin(q4k, tmp_path / "twin.gguf"), ids))


@pytest.mark.parametrize("name", ["qwen3moe", "deepseek2", "gpt-oss"])   # + latent attention, + sinks and biases
def test_a_window_holds_only_its_layers_weights(name, tiny_model, tmp_path):
    _, path = tiny_model(name)
    index = GGUFIndex(path)
    arch = load_architecture(index)

    def window_bytes(a, b):  # float32 compute: four bytes per element of the blocks' tensors
        return sum(4 * int(np.prod(t.shape)) for n, t in index.tensors.items()
                   if n.startswith("blk.") and a <= int(n.split(".")[1]) < b)
    assert WindowExecutor(arch, 1, 3, "cpu", torch.float32).weight_bytes == window_bytes(1, 3)
    r = run_pipeline(tmp_path, model=str(path), ctx=64, chunks=2, window_layers=2)
    largest = r["largest_window"]
    assert largest["weight_bytes"] == window_bytes(largest["first"], largest["last"])
    assert largest["weight_bytes"] == max(window_bytes(a, a + 2) for a in range(0, arch.hp.n_layers, 2))
