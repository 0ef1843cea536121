"""Helpers shared by the test files: the shipped data, running a pass in-process or through the
`luigi` command, and what a one-line refusal looks like."""
import contextlib
import hashlib
import json
import socket
import subprocess
import sys
from pathlib import Path

import luigi
import pytest
import torch

from pipeline.paths import CORPORA, REPO_ROOT

REFERENCE = Path(__file__).resolve().parent / "data"   # llama.cpp's figures and token dumps
HEAD40K = CORPORA / "wikitext-2-test.head40k.txt"
MODELS = ["smollm2-135m", "gemma3-270m", "qwen2.5-0.5b"]
REFERENCE_NAMES = {"smollm2-135m": "smol", "gemma3-270m": "gemma", "qwen2.5-0.5b": "qwen"}


def run_pipeline(run_root: Path, **params) -> dict:
    """Run PerplexityRun in-process on the local scheduler; return its result JSON. The CPU
    unless `device` is given: on a machine with CUDA these tests test what they say."""
    from pipeline import PerplexityRun

    result = run_root / "result.json"
    task = PerplexityRun(run_root=str(run_root), result_json=str(result), **{"device": "cpu", **params})
    summary = luigi.build([task], local_scheduler=True, detailed_summary=True, log_level="WARNING")
    assert summary.status.name in ("SUCCESS", "SUCCESS_WITH_RETRY"), summary.summary_text
    return json.loads(result.read_text())


def luigi_cli(*args, run_root):
    """`luigi --module pipeline PerplexityRun ARGS` from the repository root, as users type it;
    on the CPU unless ARGS name a --device."""
    device = [] if "--device" in args else ["--device", "cpu"]
    cmd = [sys.executable, "-m", "luigi", "--module", "pipeline", "PerplexityRun", "--run-root", str(run_root),
           *device, *args]
    return subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)


def ppl_in_two_layer_windows(path, run_root: Path) -> dict:
    """The pass's result over HEAD40K at ctx 256, 8 chunks, in 2-layer windows (the Luigi tasks, in
    process): what the families checked against a hand-written reference pin against llama-perplexity's
    figure."""
    return run_pipeline(run_root, model=str(path), corpus=str(HEAD40K), ctx=256, chunks=8, window_layers=2)


def assert_logits_are_the_reference_s(path, reference_logits, folder: Path) -> None:
    """The GGUF's float32 logits within 2e-4 of reference_logits(folder, ids) (a forward written from
    the family's modeling code over its checkpoint), far from uniform, with the same argmax."""
    ids = random_ids()
    with torch.inference_mode():
        ref = reference_logits(folder, ids)
    ours = forward(path, ids)
    assert ref.std() > 1.5
    assert (ours - ref).abs().max().item() < 2e-4
    assert (ours.argmax(-1) == ref.argmax(-1)).all()


def assert_one_line_error(done, pattern):
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR: layercycle: ")]
    assert len(errors) == 1 and pattern in errors[0], done.stderr
    assert "Traceback" not in done.stderr


def tree_digest(root: Path) -> dict:
    """Content hashes of every file of the completed outputs under a run root."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.glob("*/*/**/*")) if p.is_file() and ".partial" not in str(p)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def forward(path, ids: torch.Tensor, dtype=torch.float32, layout: torch.Tensor | None = None) -> torch.Tensor:
    """Logits [B, T, vocab] of a GGUF model over ids [B, T] (packed rows: their layout [B, T,
    fields]): the whole trunk, then the head."""
    from pipeline.gguf_io.reader import GGUFIndex
    from pipeline.model.arch import load_architecture
    from pipeline.model.executor import WindowExecutor

    arch = load_architecture(GGUFIndex(path))
    with torch.inference_mode():
        hidden = WindowExecutor(arch, 0, arch.hp.n_layers, "cpu", dtype)(arch.embed(ids, "cpu", dtype), ids=ids,
                                                                         layout=layout)
        return arch.load_head("cpu", torch.float32)(hidden)


def random_ids(n_rows=2, n_tokens=150, seed=1) -> torch.Tensor:
    """Token ids of the tiny models' 384-entry vocabulary (tests/hf_models.py)."""
    return torch.randint(1, 384, (n_rows, n_tokens), generator=torch.Generator().manual_seed(seed))


def hidden_after(path, slices: int, dtype=torch.float32) -> torch.Tensor:
    """The hidden state after a GGUF model's whole trunk over random ids, its routed experts in
    `slices` slices."""
    from pipeline.gguf_io.reader import GGUFIndex
    from pipeline.model.arch import load_architecture
    from pipeline.model.executor import WindowExecutor

    arch = load_architecture(GGUFIndex(path))
    ids = random_ids(n_rows=2, n_tokens=40, seed=3) % arch.hp.vocab
    window = WindowExecutor(arch, 0, arch.hp.n_layers, "cpu", dtype, expert_slices=slices)
    try:
        return window(arch.embed(ids, "cpu", torch.float32), ids=ids)
    finally:
        window.release()


@contextlib.contextmanager
def small_disk(path: Path, size: str):
    """A tmpfs of `size` (`4m`) mounted at `path` while the block runs; the test is skipped where
    this machine cannot mount one."""
    path.mkdir(parents=True, exist_ok=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                      capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)])
