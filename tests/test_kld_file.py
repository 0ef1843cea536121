"""llama.cpp's KL-divergence base files, both ways: a file llama-perplexity wrote read as the
base of a run, and a run's distributions written in its layout."""
import gzip
import json
import math

import numpy as np
import pytest
import torch

from pipeline.model import kld, scoring
from pipeline.run.logits_file import LogitsHeader, read_header, read_tokens

from .helpers import HEAD40K, assert_one_line_error, luigi_cli, small_disk

# llama-perplexity -m SmolLM2-135M-Instruct.Q4_1.gguf -f wikitext-2-test.head40k.txt -c 8 --chunks 1 -t 2
# -fa off -ctk f32 -ctv f32 --kl-divergence-base FILE (tests/data/llama-perplexity.md): its file, and the
# "Final estimate" it printed, the PPL of the 3 targets the file holds
LLAMA_FILE = "tests/data/llama-kld-base.smollm2.ctx8.kld.gz"
LLAMA_PPL = 1095.7101


@pytest.fixture
def llama_file(tmp_path):
    from pipeline.paths import REPO_ROOT

    path = tmp_path / "base.kld"
    path.write_bytes(gzip.decompress((REPO_ROOT / LLAMA_FILE).read_bytes()))
    return path


class SlicedHead:
    """A stand-in LM head: logits x @ weight.T, one vocabulary slice at a time."""

    def __init__(self, weight: torch.Tensor):
        self.weight = weight

    def logit_slices(self, x, width):
        for start in range(0, self.weight.shape[0], width):
            yield start, (x @ self.weight[start:start + width].T).float()


def test_reads_llama_perplexity_base_file(llama_file, tmp_path):
    h = read_header(str(llama_file))
    assert (h.n_ctx, h.n_vocab, h.n_chunk) == (8, 49152, 1) and h.rows_per_chunk == 3
    done = luigi_cli("--kl-base", str(llama_file), "--result-json", str(tmp_path / "r.json"), run_root=tmp_path)
    assert done.returncode == 0, done.stderr
    r = json.loads((tmp_path / "r.json").read_text())
    assert (r["ctx"], r["chunks"], r["tokens_scored"]) == (8, 1, 3)
    # the base's NLL read from its codes: llama-perplexity's own figure, within the codes' steps
    assert r["kld"]["ppl_base"] == pytest.approx(LLAMA_PPL, rel=1e-4)
    # the run scored the file's tokens, as a run over the same corpus does
    plain = luigi_cli("--corpus", str(HEAD40K), "--ctx", "8", "--chunks", "1", "--result-json",
                      str(tmp_path / "p.json"), run_root=tmp_path)
    assert plain.returncode == 0, plain.stderr
    assert json.loads((tmp_path / "p.json").read_text())["mean_nll"] == r["mean_nll"]


def test_kl_against_file_rows_is_llama_perplexity_formula(monkeypatch):
    # llama-perplexity --kl-divergence, per row: q = log_softmax(logits); b_i = scale * code_i + min;
    # KL = sum over b_i > -16 of exp(b_i) (b_i - q_i); top tokens compared by first maximum
    monkeypatch.setattr(scoring, "VOCAB_SLICE", 16)                  # several slices of a vocabulary of 45
    gen = torch.Generator().manual_seed(0)
    head = SlicedHead(torch.randn(45, 8, generator=gen, dtype=torch.float64).float())
    rows = torch.randn(5, 8, generator=gen) * 3
    width = LogitsHeader(8, 45, 1).row_width
    codes = np.zeros((5, width), np.uint16)
    codes[:, 4:49] = np.random.default_rng(1).integers(0, 65536, size=(5, 45))
    codes[:, :4] = np.array([[16 / 65535, -20.0]] * 5, np.float32).view(np.uint16)
    targets = torch.tensor([3, 0, 44, 17, 30])
    got = kld.file_token_stats(head, rows, targets, codes).numpy()
    z = (rows.double() @ head.weight.double().T).numpy()
    q = z - np.log(np.exp(z - z.max(1, keepdims=True)).sum(1, keepdims=True)) - z.max(1, keepdims=True)
    b = (16 / 65535) * codes[:, 4:49].astype(np.float64) - 20.0
    keep = b > -16
    want_kl = (np.where(keep, np.exp(b), 0) * (b - q)).sum(1)
    t = targets.numpy()
    np.testing.assert_allclose(got[:, 2], want_kl, atol=1e-5)
    np.testing.assert_allclose(got[:, 0], -q[range(5), t], atol=1e-5)             # the model's NLL
    np.testing.assert_allclose(got[:, 1], -b[range(5), t], atol=1e-5)             # the base's, from its codes
    np.testing.assert_array_equal(got[:, 3], (z.argmax(1) == b.argmax(1)).astype(float))


def test_written_rows_decode_to_the_log_softmax(monkeypatch):
    monkeypatch.setattr(scoring, "VOCAB_SLICE", 16)
    gen = torch.Generator().manual_seed(2)
    head = SlicedHead(torch.randn(45, 8, generator=gen) * 4)
    rows = torch.randn(6, 8, generator=gen)
    width = LogitsHeader(8, 45, 1).row_width
    out = kld.quantized_log_probs(head, rows, width)                # [6, width] uint16
    assert out.shape == (6, 50) and out.dtype == np.uint16
    scale, low = out[:, :4].copy().view(np.float32).T.astype(np.float64)
    z = (rows.double() @ head.weight.double().T).numpy()
    logp = z - z.max(1, keepdims=True) - np.log(np.exp(z - z.max(1, keepdims=True)).sum(1, keepdims=True))
    floor = np.maximum(logp.min(1), logp.max(1) - 16)                  # llama.cpp keeps 16 nats below the top
    np.testing.assert_allclose(low, floor, atol=1e-5)
    np.testing.assert_allclose(scale, (logp.max(1) - floor) / 65535, rtol=1e-5)
    decoded = scale[:, None] * out[:, 4:49] + low[:, None]
    above = logp > floor[:, None] + 1e-4
    assert (np.abs(decoded - logp)[above] <= scale.max() / 2 + 1e-5).all()
    assert (out[:, 4:49][logp < floor[:, None] - 1e-4] == 0).all()


def test_base_out_is_read_back(tmp_path):
    out = tmp_path / "ours.kld"
    done = luigi_cli("--corpus", str(HEAD40K), "--ctx", "16", "--chunks", "2", "--kl-base-out", str(out),
                     "--dump-tokens", str(tmp_path / "ids.txt"), "--result-json", str(tmp_path / "a.json"),
                     run_root=tmp_path)
    assert done.returncode == 0, done.stderr
    h = read_header(str(out))
    assert (h.n_ctx, h.n_vocab, h.n_chunk) == (16, 49152, 2) and out.stat().st_size == h.size()
    ids = np.array((tmp_path / "ids.txt").read_text().split(), dtype=np.int32)
    np.testing.assert_array_equal(read_tokens(str(out)), ids[:32])   # as tokenized, no BOS put in
    back = luigi_cli("--kl-base", str(out), "--result-json", str(tmp_path / "b.json"), run_root=tmp_path)
    assert back.returncode == 0, back.stderr
    first, k = json.loads((tmp_path / "a.json").read_text()), json.loads((tmp_path / "b.json").read_text())["kld"]
    assert k["ppl_base"] == pytest.approx(first["ppl"], rel=1e-4) and abs(k["mean"]) < 1e-5
    assert k["same_top"] == 1.0 and math.isclose(k["ppl"], first["ppl"], rel_tol=1e-12)


@pytest.mark.parametrize("extra,match", [
    (["--ctx", "64"], "--ctx does not apply"),
    (["--corpus", str(HEAD40K)], "--corpus does not apply"),
    (["--model", "qwen2.5-0.5b"], "holds distributions over 49152"),
])
def test_base_file_refusals(llama_file, tmp_path, extra, match):
    assert_one_line_error(luigi_cli("--kl-base", str(llama_file), *extra, run_root=tmp_path), match)


def test_truncated_base_file_and_base_out_of_another_method(llama_file, tmp_path):
    cut = tmp_path / "cut.kld"
    cut.write_bytes(llama_file.read_bytes()[:-100])
    assert_one_line_error(luigi_cli("--kl-base", str(cut), run_root=tmp_path), "truncated")
    assert_one_line_error(luigi_cli("--corpus", str(HEAD40K), "--method", "stride", "--ctx", "16",
                                    "--kl-base-out", str(tmp_path / "x.kld"), run_root=tmp_path), "llama-cpp method")


def test_base_out_resumes_after_a_kill(tmp_path):
    import os
    import subprocess
    import sys

    from pipeline.paths import REPO_ROOT

    def run(root, out, env=None):
        cmd = [sys.executable, "-m", "luigi", "--module", "pipeline", "PerplexityRun", "--device", "cpu",
               "--run-root", str(tmp_path / root), "--corpus", str(HEAD40K), "--ctx", "16", "--chunks", "6",
               "--sequences-per-chunk", "2", "--kl-base-out", str(tmp_path / out)]
        return subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=900,
                              env={**os.environ, **(env or {})})

    assert run("whole", "whole.kld").returncode == 0
    # killed once the second chunk is computed: its rows on disk, not its scores
    killed = run("cut", "cut.kld", {"LAYERCYCLE_FAULT": "chunk-computed@Score#2"})
    assert killed.returncode < 0 and not (tmp_path / "cut.kld").exists()
    done = run("cut", "cut.kld")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "cut.kld").read_bytes() == (tmp_path / "whole.kld").read_bytes()


def test_the_disk_preflight_counts_kl_scores_and_a_base_out_once_where_it_is_linked(tmp_path, monkeypatch):
    """Against a KL base a position's figures take 5 float64 (40 bytes, not 8); --kl-base-out's
    file is held by the Score output, and FILE beside the run root is that file linked: counted
    once, twice with shards (copied together), refused in one line before any work where it does
    not fit."""
    from pipeline import PerplexityRun
    from pipeline.errors import UserError
    from pipeline.store import outputs

    common = dict(device="cpu", task="wikitext-2", corpus=str(HEAD40K), ctx=64, chunks=4, run_root=str(tmp_path))
    file_bytes = LogitsHeader(64, 49152, 4).size()
    out = dict(kl_base="smollm2-135m", kl_base_out=str(tmp_path / "base.kld"))
    for params, need in ((dict(), 8 * 4 * 64), (dict(kl_base="smollm2-135m"), 40 * 4 * 64),
                         (out, 40 * 4 * 64 + file_bytes), (out | dict(shards=2), 40 * 4 * 64 + 2 * file_bytes)):
        run = PerplexityRun(**common, **params)
        monkeypatch.setattr(outputs, "free_bytes", lambda path, free=need: free)
        run.check_score_disk()
        monkeypatch.setattr(outputs, "free_bytes", lambda path, free=need - 1: free)
        with pytest.raises(UserError, match=r"the run's scores.* need about .* GiB under .* GiB are free"):
            run.check_score_disk()


def test_a_base_out_is_the_score_output_s_file_linked_and_copied_where_it_cannot_be(tmp_path):
    """One shard: FILE is the Score output's file (one inode, no second copy on disk); two shards:
    their rows copied into FILE, byte for byte the one-shard file."""
    def run(root, out, *extra):
        done = luigi_cli("--corpus", str(HEAD40K), "--ctx", "16", "--chunks", "4", "--sequences-per-chunk", "2",
                         "--kl-base-out", str(tmp_path / out), *extra, run_root=tmp_path / root)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "the Score output's file linked, no second copy" in run("one", "one.kld")
    rows, = (tmp_path / "one" / "Score").glob("*/logits.kld")
    assert (tmp_path / "one.kld").samefile(rows)
    assert "copied from the Score outputs" in run("two", "two.kld", "--shards", "2")
    assert (tmp_path / "two.kld").read_bytes() == (tmp_path / "one.kld").read_bytes()
    assert read_header(str(tmp_path / "two.kld")).n_chunk == 4


def test_a_base_out_that_fills_the_disk_is_one_line_and_leaves_nothing(tmp_path):
    from pipeline.errors import UserError
    from pipeline.run.logits_file import publish, start_file, write_rows

    with small_disk(tmp_path / "small", "1m") as small:
        header = LogitsHeader(64, 49152, 1)
        rows = tmp_path / "rows.kld"          # 1.5 MiB of rows, on another disk: copied
        start_file(rows, header, np.zeros(64, np.int32))
        write_rows(rows, header, 0, np.ones((header.rows_per_chunk, header.row_width), np.uint16))
        with pytest.raises(UserError, match=r"cannot write .*base.kld: No space left on device; the run's "
                                            r"outputs are kept"):
            publish(small / "base.kld", header, [(rows, range(1))])
        assert not list(small.iterdir())


def test_a_base_out_over_an_object_store_run_root_is_refused(tmp_path):
    from pipeline import PerplexityRun
    from pipeline.errors import UserError

    run = PerplexityRun(device="cpu", corpus=str(HEAD40K), ctx=16, run_root="s3://bucket/runs",
                        kl_base_out=str(tmp_path / "base.kld"))
    with pytest.raises(UserError, match=r"--kl-base-out writes its file's rows in place .* give a local "
                                        r"--run-root, not s3://bucket/runs"):
        run.check_kl_options()
