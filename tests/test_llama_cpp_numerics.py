"""`--numerics llama-cpp` (pipeline/model/llama_cpp_numerics.py): the weights read in it take part in
products as ggml-cpu's do, through every way a family takes their rows; what it cannot emulate is
refused; and over a real model it moves the figure to llama-perplexity's default command."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pipeline.gguf_io.activation_quants import block_mins, product
from pipeline.gguf_io.dequant import dequantize
from pipeline.gguf_io.ggml_types import type_named
from pipeline.model.llama_cpp_numerics import (
    GGMLWeight,
    as_read,
    gelu_tanh,
    kv_cached,
    shared_input,
    shared_rows,
)
from pipeline.numerics import MODES, set_numerics

from . import llama_cpp_layers
from .ggml_reference import ggml_quantize
from .helpers import HEAD40K, assert_one_line_error, luigi_cli, run_pipeline

# llama-perplexity's default command over the 18 chunks of 512 of head40k (`-c 512 -b 512 -t 2`)
SMOLLM2_DEFAULT_18_CHUNKS = 27.8853


@pytest.fixture
def llama_cpp():
    set_numerics("llama-cpp", "llama")
    yield
    set_numerics("exact", "llama")


def experts(type_name: str, E=3, N=64, K=256) -> tuple[np.ndarray, torch.Tensor]:
    """(the file's rows [E, N, row bytes], their values [E, N, K]) of random experts in `type_name`."""
    qtype = type_named(type_name)
    w = np.random.default_rng(0).standard_normal((E * N, K)).astype(np.float32)
    raw = ggml_quantize(w, qtype).reshape(E, N, -1)
    return raw, dequantize(raw, qtype)


@pytest.mark.parametrize("type_name", ["Q4_1", "Q4_K", "Q8_0"])
def test_a_weights_rows_and_experts_multiply_as_ggml(type_name, llama_cpp):
    """An expert taken by index, gate and up by chunk, rows by slice: each product as the weight's own."""
    raw, values = experts(type_name)
    w = as_read(values, raw, type_named(type_name))
    assert isinstance(w, GGMLWeight)
    x = torch.randn(5, 256) * 3
    mins = block_mins(raw, type_named(type_name))
    take = lambda m, f: None if m is None else f(m)   # noqa: E731
    cases = {"expert": (w[1], values[1], take(mins, lambda m: m[1])),
             "chunk": (w[2].chunk(2, dim=0)[1], values[2, 32:], take(mins, lambda m: m[2, 32:])),
             "slice": (w[0][:16], values[0, :16], take(mins, lambda m: m[0, :16]))}
    for name, (weight, plain, m) in cases.items():
        assert isinstance(weight, GGMLWeight), name
        expected = product(x, plain, None, weight.dot_type, m)
        assert torch.equal(F.linear(x, weight), expected), name
        assert (F.linear(x, plain) - expected).abs().max() > 1e-3, name   # the emulation changes the product


@pytest.mark.parametrize("type_name", ["Q4_1", "Q4_K", "Q8_0"])
def test_weights_sharing_an_input_multiply_as_each_alone(type_name, llama_cpp):
    """q, k and v (gate and up) quantize their input once: the products are those of each alone."""
    raw, values = experts(type_name)
    w = as_read(values, raw, type_named(type_name))
    x = torch.randn(5, 256) * 3
    linear = shared_input(x, w[0], w[2])
    for e in (0, 2):
        assert torch.equal(linear(w[e]), F.linear(x, w[e]))
    assert not torch.equal(linear(w[0]), F.linear(x, values[0]))   # and they are emulated


@pytest.mark.parametrize("type_name", ["Q4_1", "Q4_K"])
def test_experts_take_rows_of_an_input_quantized_once(type_name, llama_cpp):
    """Each expert's tokens, taken from an input quantized once for every expert (as ggml's expert
    products do), multiply as those rows quantized for that expert alone."""
    raw, values = experts(type_name)
    w = as_read(values, raw, type_named(type_name))
    x = torch.randn(7, 256) * 3
    rows = shared_rows(x, w, w)
    for e, token in enumerate((torch.tensor([0, 3, 6]), torch.tensor([1]), torch.arange(7))):
        assert torch.equal(rows(token)(w[e]), F.linear(x[token], w[e])), e
    assert shared_rows(x, values[0]) is None                  # a plain weight: nothing to share


def test_a_product_it_does_not_emulate_is_refused(llama_cpp):
    raw, values = experts("Q4_K")
    w = as_read(values, raw, type_named("Q4_K"))
    for other in (lambda: torch.randn(5, 256) @ w[0].T, lambda: torch.matmul(torch.randn(5, 64), w[0]),
                  lambda: w * 2, lambda: torch.cat([w[0], w[1]])):
        with pytest.raises(NotImplementedError, match="of a weight is not emulated"):
            other()
    with pytest.raises(NotImplementedError, match="across a weight's rows"):
        w[0][:, :128]
    assert w.shape == (3, 64, 256) and w.dtype == torch.float32 and w.nbytes == 3 * 64 * 256 * 4


def test_exact_numerics_read_plain_weights_and_keep_kv_and_gelu():
    raw, values = experts("Q4_K")
    assert type(as_read(values, raw, type_named("Q4_K"))) is torch.Tensor
    x = torch.randn(1000) * 4
    assert torch.equal(kv_cached(x), x) and torch.equal(gelu_tanh(x), F.gelu(x, approximate="tanh"))


def test_llama_cpp_numerics_round_the_cache_and_read_gelu_from_float16(llama_cpp):
    x = torch.randn(1000) * 4
    assert torch.equal(kv_cached(x), x.half().float()) and not torch.equal(kv_cached(x), x)
    table = gelu_tanh(x)
    inside = x.abs() < 10            # outside, 0 or x itself
    assert torch.equal(table[inside], table[inside].half().float()) and torch.equal(table[x >= 10], x[x >= 10])
    assert (table - F.gelu(x, approximate="tanh")).abs().max() < 5e-3


def test_rms_norm_is_ggmls_bit_for_bit(llama_cpp):
    """RMSNorm as ggml's rms_norm computes it (libggml through ctypes), over rows of the scales a
    residual stream has: every value the same, where exact numerics (a float32 mean of the squares)
    land a step away in some rows, and the Q8 quantizer after a norm rounds on that step."""
    from pipeline.model.arch.blocks import rms_norm

    from . import ggml_cpu

    rng = np.random.default_rng(7)
    x = (rng.standard_normal((256, 640)) * np.exp(rng.normal(0, 2, (256, 1)))).astype(np.float32)
    reference = ggml_cpu.rms_norm(x, 1e-6)
    assert np.array_equal(rms_norm(torch.from_numpy(x), None, 1e-6).numpy(), reference)
    set_numerics("exact", "llama")
    assert not np.array_equal(rms_norm(torch.from_numpy(x), None, 1e-6).numpy(), reference)


@pytest.mark.parametrize("model", llama_cpp_layers.MODELS)
def test_a_first_layer_computes_what_llama_cpp_computes(model, model_path):
    """The first layer of a registered model over 64 tokens, against llama.cpp's own output of it
    (tests/llama_cpp_layers.py): in llama-cpp numerics llama.cpp's values to float32 rounding in
    the median row (2e-7 of the layer's update measured; a row where a value fell on the other
    side of an 8-bit rounding lies further), where exact numerics lie 6e-3 to 1e-2 away and a
    mean square summed in float32 3e-3 (Gemma-3) and 7e-4 (SmolLM2)."""
    from pipeline.gguf_io.reader import open_gguf
    from pipeline.model.arch import load_architecture
    from pipeline.model.arch.modules import Tables

    tokens, reference = llama_cpp_layers.read()[model]
    arch = load_architecture(open_gguf(model_path(model)))
    ids = torch.from_numpy(tokens).long()[None]                               # [1, 64]
    tables, error = Tables(len(tokens), torch.device("cpu"), torch.float32), {}
    for mode in MODES:
        set_numerics(mode, arch.gguf.architecture)
        with torch.inference_mode():
            x = arch.embed(ids, "cpu", torch.float32)                         # [1, 64, hidden]
            out = arch.load_layer(0, torch.device("cpu"), torch.float32)(x, tables, {})
        update = reference - x[0].numpy()
        error[mode] = float(np.median(np.abs(out[0].numpy() - reference).max(1) / np.abs(update).max(1)))
    assert error["llama-cpp"] < 1e-6 and error["exact"] > 1e-3, error


def test_rope_angles_are_ggmls(llama_cpp):
    """cos and sin as ggml's rope computes them (libggml through ctypes), SmolLM2's RoPE over 512
    positions: within one float32 step (cosf against a correctly rounded cosine), where the float64
    angles of exact numerics are up to 3e-5 away."""
    from pipeline.model.arch.rope import RopeSpec, rope_tables

    from . import ggml_cpu

    spec = RopeSpec(dim=64, base=100000.0, neox=False)
    cos, sin = ggml_cpu.rope_cos_sin(spec.dim, spec.base, 512)
    ours = rope_tables(spec, 512, "cpu", torch.float32)
    assert max(np.abs(t.numpy() - ref).max() for t, ref in zip(ours, (cos, sin))) <= 6e-8
    set_numerics("exact", "llama")
    exact = rope_tables(spec, 512, "cpu", torch.float32)
    assert max(np.abs(t.numpy() - ref).max() for t, ref in zip(exact, (cos, sin))) > 1e-5


def test_smollm2_moves_to_llama_perplexitys_default_figure(tmp_path):
    """The 18 chunks of 512 of head40k: exact numerics lie 0.54% below llama-perplexity's default
    command (27.8853 there), llama-cpp numerics within 0.4% of it (measured: 0.14%). It cannot be
    pinned closer: the mode's figure is one draw of the 8-bit rounding and llama-perplexity's another
    (a last-bit change re-draws it: over these chunks a draw's standard deviation is 0.15%, NUMERICS.md,
    and llama-perplexity's own -fa off gives 27.8373)."""
    r = run_pipeline(tmp_path, model="smollm2-135m", corpus=str(HEAD40K), ctx=512, chunks=18, numerics="llama-cpp")
    assert r["numerics"] == "llama-cpp" and r["chunks"] == 18
    assert abs(np.log(r["ppl"] / SMOLLM2_DEFAULT_18_CHUNKS)) < 0.004, r["ppl"]


def test_numerics_a_family_does_not_emulate_or_in_16_bits_are_refused_in_one_line(tmp_path, model_path):
    from pipeline.tools.architectures import DEEPSEEK4
    from pipeline.tools.synthetic import Shape, write_synthetic_gguf

    done = luigi_cli("--model", "smollm2-135m", "--numerics", "llama-cpp", "--compute-dtype", "bfloat16",
                     run_root=tmp_path)
    assert_one_line_error(done, "--numerics llama-cpp computes in float32")
    shape = {k: v for k, v in DEEPSEEK4.items() if k != "tokenizer_from"}
    ds4 = write_synthetic_gguf(tmp_path / "ds4.gguf", Shape(**shape), model_path("smollm2-135m"))
    done = luigi_cli("--model", str(ds4), "--numerics", "llama-cpp", run_root=tmp_path)
    assert_one_line_error(done, "--numerics llama-cpp is not emulated for the deepseek4 architecture")
