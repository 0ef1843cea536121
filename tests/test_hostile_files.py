"""Damaged and contradictory GGUF files, made from a real model by changing a few bytes of its
header: every one ends in seconds with one line naming the problem, a non-zero exit and no
result file, before any work."""
import shutil
import struct
import time

import pytest

from pipeline.gguf_io.reader import GGUFIndex

from .helpers import HEAD40K, assert_one_line_error, luigi_cli

ARGS = ["--task", "wikitext-2", "--corpus", str(HEAD40K), "--ctx", "64", "--chunks", "2"]


def tensor_entries(index: GGUFIndex) -> dict[str, int]:
    """Where each tensor's entry (name length, name, n_dims, dims, type, offset) starts in the
    header, walked independently of the reader."""
    raw = index.path.read_bytes()[:4 << 20]
    pos, entries = max(end for _, end in index.spans.values()), {}
    for _ in range(len(index.tensors)):
        start = pos
        (n,) = struct.unpack_from("<Q", raw, pos)
        name = raw[pos + 8:pos + 8 + n].decode()
        pos += 8 + n
        (n_dims,) = struct.unpack_from("<I", raw, pos)
        pos += 4 + 8 * n_dims + 12
        entries[name] = start
    return entries


def patch(data: bytearray, pos: int, fmt: str, value) -> None:
    struct.pack_into(fmt, data, pos, value)


def scalar(index, key):   # where a uint32 / float32 metadata value sits
    return index.spans[key][1] - 4


def dims_at(index, entries, name):   # the first dimension of a tensor's entry
    return entries[name] + 8 + len(name) + 4


CASES = {
    # damaged header counts and fields
    "metadata count": (lambda i, e, d: patch(d, 16, "<Q", 1 << 40), "more than the file's"),
    "tensor count": (lambda i, e, d: patch(d, 8, "<Q", 1 << 40), "more than the file's"),
    "key length": (lambda i, e, d: patch(d, 24, "<Q", 1 << 50), "not a valid GGUF file"),
    "dimension count": (lambda i, e, d: patch(d, dims_at(i, e, "blk.3.attn_q.weight") - 4, "<I", 7),
                        "has 7 dimensions"),
    "zero dimension": (lambda i, e, d: patch(d, dims_at(i, e, "blk.3.attn_q.weight"), "<Q", 0), "cannot hold"),
    "type id": (lambda i, e, d: patch(d, dims_at(i, e, "blk.3.attn_q.weight") + 16, "<I", 250), "unknown GGML type"),
    "offset past the end": (lambda i, e, d: patch(d, dims_at(i, e, "blk.3.attn_q.weight") + 20, "<Q", 1 << 40),
                            "truncated"),
    "misaligned offset": (lambda i, e, d: patch(d, dims_at(i, e, "blk.3.attn_q.weight") + 20, "<Q",
                                                i.tensors["blk.3.attn_q.weight"].offset - i.tensors[
                                                    "token_embd.weight"].offset + 1), "not a multiple"),
    "tensor named twice": (lambda i, e, d: d.__setitem__(slice(e["blk.0.attn_k.weight"] + 8,
                                                               e["blk.0.attn_k.weight"] + 8 + 19),
                                                         b"blk.0.attn_q.weight"), "appears twice"),
    "key named twice": (lambda i, e, d: d.__setitem__(slice(i.spans["llama.rope.freq_base"][0] + 8,
                                                            i.spans["llama.rope.freq_base"][0] + 28),
                                                      b"llama.context_length"), "appears twice"),
    # metadata that contradicts the tensors
    "no heads": (lambda i, e, d: patch(d, scalar(i, "llama.attention.head_count"), "<I", 0), "not an attention layer"),
    "heads": (lambda i, e, d: patch(d, scalar(i, "llama.attention.head_count"), "<I", 6), "attn_k.weight is"),
    "heads that KV heads do not divide": (lambda i, e, d: patch(d, scalar(i, "llama.attention.head_count"), "<I", 7),
                                          "7 heads, 3 KV heads"),
    "KV heads": (lambda i, e, d: patch(d, scalar(i, "llama.attention.head_count_kv"), "<I", 9), "attn_k.weight is"),
    "embedding length": (lambda i, e, d: patch(d, scalar(i, "llama.embedding_length"), "<I", 512),
                         "token_embd.weight is"),
    "more blocks": (lambda i, e, d: patch(d, scalar(i, "llama.block_count"), "<I", 31), "block 30 has none"),
    "fewer blocks": (lambda i, e, d: patch(d, scalar(i, "llama.block_count"), "<I", 29), "block 29 has tensors"),
}


@pytest.fixture(scope="module")
def source(model_path):
    path = model_path("smollm2-135m")
    index = GGUFIndex(path)
    return path, index, tensor_entries(index)


@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_file_ends_in_one_line(case, source, tmp_path):
    path, index, entries = source
    damage, message = CASES[case]
    head = bytearray(path.read_bytes()[:4 << 20])   # every header field lies in the first 4 MiB
    damage(index, entries, head)
    bad = tmp_path / "bad.gguf"
    shutil.copyfile(path, bad)
    with open(bad, "r+b") as f:
        f.write(head)
    result = tmp_path / "result.json"
    started = time.monotonic()
    done = luigi_cli("--model", str(bad), *ARGS, "--result-json", str(result), run_root=tmp_path / "runs")
    assert_one_line_error(done, message)
    assert not result.exists() and time.monotonic() - started < 60
    assert not (tmp_path / "runs" / "Embed").exists()   # refused before any work


def test_vocabulary_and_alignment_are_checked(tmp_path):
    from gguf import GGUFWriter, Keys

    from pipeline.errors import UserError
    from pipeline.model.arch import load_architecture

    from .tiny_gguf import rewrite_gguf, write_tiny_gguf

    tiny = write_tiny_gguf(tmp_path / "tiny.gguf")
    short = rewrite_gguf(tiny, tmp_path / "short.gguf",
                         metadata={"tokenizer.ggml.tokens": [f"t{i}" for i in range(60)]})
    with pytest.raises(UserError, match=r"token_embd.weight is \[64, 32\] where the metadata gives \[60, 32\]"):
        load_architecture(GGUFIndex(short))
    odd = GGUFWriter(str(tmp_path / "odd.gguf"), "llama")
    odd.add_uint32(Keys.General.ALIGNMENT, 48)   # the writer itself refuses it: written as a plain key
    odd.write_header_to_file()
    odd.write_kv_data_to_file()
    odd.write_tensors_to_file()
    odd.close()
    with pytest.raises(UserError, match="general.alignment = 48 is not a power of two"):
        GGUFIndex(tmp_path / "odd.gguf")


def test_two_thousand_fuzzed_headers_are_each_accepted_or_refused_in_one_line(model_path):
    """SmolLM2's header changed at random 2,000 times (extreme counts, lengths, types, dimensions
    and offsets, random bytes, bit flips, cuts), each variant opened as a run opens a model before
    its first window, in a process whose address space is capped at 8 GiB: no other exception,
    no variant over 20 s. `python -m pipeline.stress --headers N` runs more."""
    import subprocess
    import sys

    from pipeline.paths import REPO_ROOT

    model_path("smollm2-135m")
    done = subprocess.run([sys.executable, "-m", "pipeline.stress", "--headers", "2000", "--seed", "0"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    tally = dict(line.rsplit(None, 1) for line in done.stdout.splitlines()[-4:])
    assert tally["variants"] == "2000" and tally["failed"] == "0"
    assert int(tally["accepted"]) > 50 and int(tally["refused in one line"]) > 1000
