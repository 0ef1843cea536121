"""A model's identity costs no read of the file, and two files that share it (alike but for bytes
the identity's samples miss) never share an output: each output is checked against the sha256
of the weights it was computed from, taken as the pass read them."""
import hashlib
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from gguf import GGUFReader

from pipeline.gguf_io.identity import sample_spans
from pipeline.gguf_io.reader import GGUFIndex
from pipeline.paths import REPO_ROOT
from pipeline.store import outputs

from .helpers import HEAD40K, run_pipeline

RUN = dict(task="wikitext-2", corpus=str(HEAD40K), ctx=64, chunks=2, window_layers=10, keep_boundaries=True)
CHANGED = "blk.15.ffn_down.weight"   # in window [10, 20) of RUN's three


@pytest.fixture(scope="module")
def twins(tmp_path_factory, model_path):
    """SmolLM2 (A) and a copy (B) whose one Q4_1 block of CHANGED, none the identity samples,
    has other quants."""
    folder = tmp_path_factory.mktemp("twins")
    a, b = folder / "a.gguf", folder / "b.gguf"
    shutil.copyfile(model_path("smollm2-135m"), a)
    data = bytearray(a.read_bytes())
    info = GGUFIndex(a).tensors[CHANGED]
    block = 20                                           # Q4_1: two float16 scales, 16 bytes of quants
    sampled = sample_spans(info)
    start = next(o for o in range(info.offset, info.offset + info.n_bytes, block)
                 if all(o + block <= s or o >= e for s, e in sampled) and o > sampled[3][1])
    for k in range(start + 4, start + block):
        data[k] ^= 0x11
    b.write_bytes(bytes(data))
    return a, b


def manifest(root, family: str, layers=None) -> tuple:
    """(folder, manifest) of the one output of `family` under `root` (of a LayerWindow, the one of `layers`)."""
    for d in (root / family).iterdir():
        if outputs.is_complete(d) and (layers is None or outputs.read_manifest(d)["identity"]["layers"] == layers):
            return d, outputs.read_manifest(d)
    raise AssertionError(f"no {family} {layers} under {root}")


def test_the_identity_reads_kilobytes_of_a_tensor_not_the_file(twins, monkeypatch):
    a, _ = twins
    index, read = GGUFIndex(a), []
    real = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, n, at: read.append(n) or real(fd, n, at))
    assert len(index.identity.model_id) == 64
    assert 0 < sum(read) <= len(index.tensors) * 8 * 4096 < a.stat().st_size / 10


def test_two_files_that_differ_in_one_unsampled_block_never_share_an_output(twins, tmp_path):
    a, b = twins
    assert GGUFIndex(a).identity.model_id == GGUFIndex(b).identity.model_id   # the samples miss the block
    root = tmp_path / "shared"
    first_a = run_pipeline(root, model=str(a), **RUN)
    kept = {layers[0]: manifest(root, "LayerWindow", layers) for layers in ([0, 10], [10, 20], [20, 30])}
    b_after_a = run_pipeline(root, model=str(b), **RUN)
    fresh_b = run_pipeline(tmp_path / "fresh", model=str(b), **RUN)
    assert b_after_a["mean_nll"] == fresh_b["mean_nll"] != first_a["mean_nll"]
    assert b_after_a["model"]["id"] == first_a["model"]["id"]
    assert b_after_a["model"]["content_sha256"] == fresh_b["model"]["content_sha256"] != \
        first_a["model"]["content_sha256"]
    # the window before the changed block is B's too, untouched; those after it were computed again
    assert manifest(root, "LayerWindow", [0, 10]) == kept[0]
    for layers in ([10, 20], [20, 30]):
        folder, again = manifest(root, "LayerWindow", layers)
        assert folder == kept[layers[0]][0] and again["content_sha256"] != kept[layers[0]][1]["content_sha256"]
    # A edited in place into B: its path, another modification time
    shutil.copyfile(b, a)
    assert run_pipeline(root, model=str(a), **RUN)["mean_nll"] == fresh_b["mean_nll"]


def test_chunks_computed_from_another_file_are_dropped_not_resumed(twins, tmp_path):
    """A kill in window [20, 30) of A's pass, then B's run (the same identity) over the run root:
    B's figures, not A's chunks under B's name."""
    a, b = twins
    cmd = [sys.executable, "-m", "luigi", "--module", "pipeline", "PerplexityRun", "--run-root", str(tmp_path / "r"),
           "--device", "cpu", "--model", str(a), "--task", "wikitext-2", "--corpus", str(HEAD40K), "--ctx", "64",
           "--chunks", "8", "--sequences-per-chunk", "2", "--window-layers", "10"]
    killed = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=900,
                            env={**os.environ, "LAYERCYCLE_FAULT": "chunk-written@LayerWindow [20..30)#2"})
    assert killed.returncode < 0, killed.stderr                        # SIGKILL
    (partial,) = (tmp_path / "r" / "LayerWindow").glob("*.partial")
    assert json.loads((partial / "model-files.json").read_text())[0][0] == str(a)
    params = dict(RUN, chunks=8, sequences_per_chunk=2, keep_boundaries=False)
    resumed = run_pipeline(tmp_path / "r", model=str(b), **params)
    assert resumed["mean_nll"] == run_pipeline(tmp_path / "fresh", model=str(b), **params)["mean_nll"]
    assert manifest(tmp_path / "r", "LayerWindow", [20, 30])[1]["chunks_computed"] == 4


def independent_content_sha256(path, model_id: str) -> str:
    """The documented content_sha256 from gguf-py's reading of the file: each tensor's sha256 in
    file order (of its outer slices' sha256s for one of three or more dimensions), after the id."""
    h = hashlib.sha256(model_id.encode())
    for t in sorted(GGUFReader(path).tensors, key=lambda t: t.data_offset):
        data = np.ascontiguousarray(t.data).view(np.uint8).reshape(-1)
        n_outer = int(t.shape[-1]) if len(t.shape) >= 3 else 1     # gguf-py's shape is ggml's order
        parts = data.reshape(n_outer, -1) if n_outer > 1 else [data]
        digest = (hashlib.sha256(b"".join(hashlib.sha256(p).digest() for p in parts)).hexdigest() if n_outer > 1
                  else hashlib.sha256(data).hexdigest())
        h.update(f"{t.name}:{digest}\n".encode())
    return h.hexdigest()


def test_the_content_sha256_is_gguf_pys_bytes_whole_or_read_in_expert_slices(tiny_model, tmp_path):
    from pipeline.model.arch import load_architecture
    from pipeline.model.executor import WindowExecutor

    _, path = tiny_model("qwen3moe")
    copy = tmp_path / "moe.gguf"              # a file no record knows: every sha256 from this pass's reads
    shutil.copyfile(path, copy)
    index = GGUFIndex(copy)
    arch = load_architecture(index)
    window = WindowExecutor(arch, 0, arch.hp.n_layers, "cpu", torch.float32, expert_slices=3)
    ids = torch.arange(40).reshape(2, 20) % arch.hp.vocab
    window(arch.embed(ids, "cpu", torch.float32), ids=ids)
    window.release()
    experts = "blk.0.ffn_down_exps.weight"
    index.identity.flush()
    assert experts in index.identity.known or index.identity.slices.get(experts)   # hashed a slice at a time
    expected = independent_content_sha256(copy, index.identity.model_id)
    assert index.identity.content(list(index.tensors)) == expected
    assert GGUFIndex(copy).identity.content(list(index.tensors)) == expected          # the same, read whole


def test_a_model_read_and_dropped_keeps_no_thread_and_no_mapping(twins):
    """A sweep or the header fuzzer opens thousands of models in one process: once a model's
    tensors are hashed and the index dropped, its maps go with it and its hashing thread returns."""
    import threading
    import time
    import weakref

    from pipeline.model.arch.loading import read_tensor

    index = GGUFIndex(twins[0])
    read_tensor(index, CHANGED, "cpu", torch.float32)
    index.identity.flush()
    assert CHANGED in index.identity.known
    dropped = weakref.ref(index)
    del index
    assert dropped() is None                                   # freed by its count, no cycle
    deadline = time.monotonic() + 5
    while any(t.name == "tensor-sha256" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(t.name == "tensor-sha256" for t in threading.enumerate())


def test_a_path_keeps_one_record_valid_for_the_file_instance_it_names(tmp_path, model_path):
    """The sha256s of a file replaced at its path are not trusted, and its record replaces the old
    one: a path keeps one record, however often its file changes."""
    from pipeline.model.arch.loading import read_tensor

    path = tmp_path / "m.gguf"
    shutil.copyfile(model_path("smollm2-135m"), path)
    first = GGUFIndex(path)
    read_tensor(first, CHANGED, "cpu", torch.float32)
    first.identity.save()
    assert CHANGED in json.loads(first.identity.record.read_text())["tensors"]
    os.utime(path, ns=(1, 1))                              # the same bytes, another instance
    second = GGUFIndex(path)
    assert second.identity.record == first.identity.record
    assert CHANGED not in second.identity.known
    second.identity.save()
    assert CHANGED not in json.loads(second.identity.record.read_text())["tensors"]
