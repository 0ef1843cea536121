"""KL-divergence against a base model: zero against itself, the base's figures equal its own
run's, and against a copy re-quantized with gguf-py the KLD equals a float64 computation over
Hugging Face transformers' logits of both files."""
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import quants

from .helpers import assert_one_line_error, luigi_cli, run_pipeline
from .tiny_gguf import rewrite_gguf

CTX, CHUNKS = 128, 2


def test_model_against_itself_gives_zero(tmp_path):
    r = run_pipeline(tmp_path, kl_base="smollm2-135m", ctx=CTX, chunks=3)
    k = r["kld"]
    assert k["mean"] == 0 and k["max"] == 0 and k["same_top"] == 1 and k["delta_p_rms"] == 0
    assert k["ppl_ratio"] == 1 and k["ppl_base"] == r["ppl"] and k["tokens"] == r["tokens_scored"]


@pytest.fixture(scope="module")
def requantized(model_path, tmp_path_factory):
    """SmolLM2 with every Q4_1 tensor dequantized and re-quantized to Q4_0 by gguf-py."""
    def to_q4_0(name, qtype, data):
        if qtype != Q.Q4_1:
            return data, qtype
        q = quants.quantize(quants.dequantize(data, qtype), Q.Q4_0)
        return q, Q.Q4_0
    return rewrite_gguf(model_path("smollm2-135m"), tmp_path_factory.mktemp("kld") / "smollm2-q4_0.gguf", to_q4_0)


def test_requantized_copy_matches_a_float64_computation(requantized, model_path, tmp_path):
    from transformers import AutoModelForCausalLM

    from pipeline.gguf_io.reader import GGUFIndex
    from pipeline.gguf_io.tokenizer import load_tokenizer
    from pipeline.run.evaltask import pydoc_topics_text

    base = model_path("smollm2-135m")
    text = pydoc_topics_text()[:20000]
    ids = np.array(load_tokenizer(GGUFIndex(base)).encode(text, add_bos=False)[:CTX * CHUNKS])
    tokens = tmp_path / "ids.txt"
    tokens.write_text(" ".join(map(str, ids)))
    r = run_pipeline(tmp_path, model=str(requantized), kl_base="smollm2-135m", tokens_file=str(tokens),
                     ctx=CTX, chunks=CHUNKS, bos="no")
    own_base = run_pipeline(tmp_path, model="smollm2-135m", tokens_file=str(tokens), ctx=CTX, chunks=CHUNKS, bos="no")
    assert r["kld"]["ppl_base"] == own_base["ppl"]   # the stored float32 boundary is the base, exactly

    logp = {}
    for name, path in (("base", base), ("q", requantized)):
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
        with torch.inference_mode():
            logits = model.double()(torch.from_numpy(ids.reshape(CHUNKS, CTX))).logits
        logp[name] = torch.log_softmax(logits[:, CTX // 2:CTX - 1], -1)   # rows predicting the scored tokens
    kld = (logp["base"].exp() * (logp["base"] - logp["q"])).sum(-1)
    same = (logp["base"].argmax(-1) == logp["q"].argmax(-1)).double().mean().item()
    assert r["kld"]["tokens"] == kld.numel()
    assert r["kld"]["mean"] > 1e-3                                  # a real difference
    assert r["kld"]["mean"] == pytest.approx(kld.mean().item(), rel=0.02)
    assert r["kld"]["median"] == pytest.approx(kld.median().item(), rel=0.1)
    assert r["kld"]["same_top"] == pytest.approx(same, abs=2 / kld.numel())


def test_a_base_over_token_ids_must_have_the_model_s_vocabulary(tmp_path, model_path):
    """Over --tokens-file ids no tokenizer is compared, but the vocabulary still is: a base of
    another size, or of the same size with other token strings, is refused in one line."""
    from pipeline import PerplexityRun
    from pipeline.errors import UserError
    from pipeline.gguf_io.reader import GGUFIndex

    ids = tmp_path / "ids.txt"
    ids.write_text(" ".join(map(str, range(1, 200))))
    smol = model_path("smollm2-135m")
    tokens = GGUFIndex(smol).strings("tokenizer.ggml.tokens")
    renamed = rewrite_gguf(smol, tmp_path / "renamed.gguf",
                           metadata={"tokenizer.ggml.tokens": tokens[:100] + ["renamed"] + tokens[101:]})
    for base, message in ((model_path("qwen2.5-0.5b"), "its vocabulary has 151,936 tokens, the model's 49,152"),
                          (renamed, "its tokens differ from the model's")):
        run = PerplexityRun(device="cpu", tokens_file=str(ids), kl_base=str(base), ctx=CTX, chunks=1,
                            run_root=str(tmp_path / "runs"))
        with pytest.raises(UserError, match=message):
            run.score_tasks(check_memory=False)


def test_base_with_another_tokenizer_is_refused(tmp_path, model_path):
    """Another vocabulary (Gemma-3's 262,144 tokens), through the command; the same tokens under
    another pre-tokenizer, before any work."""
    from pipeline import PerplexityRun
    from pipeline.errors import UserError

    done = luigi_cli("--kl-base", "gemma3-270m", "--ctx", str(CTX), "--chunks", "2", run_root=tmp_path)
    assert_one_line_error(done, "its vocabulary has 262,144 tokens, the model's 49,152")
    other = rewrite_gguf(model_path("smollm2-135m"), tmp_path / "pre.gguf", metadata={"tokenizer.ggml.pre": "qwen2"})
    run = PerplexityRun(device="cpu", kl_base=str(other), ctx=CTX, chunks=2, run_root=str(tmp_path / "runs"))
    with pytest.raises(UserError, match="its tokenizer differs from the model's"):
        run.score_tasks(check_memory=False)
