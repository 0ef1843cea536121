"""A device that runs out of memory mid-pass (the CPU standing in, with torch's CUDA
out-of-memory error raised in the second chunk) ends the run with one line, the failure
recorded beside the window's output; the rerun keeps the chunk computed before it and gives
the result of an uninterrupted pass."""
import luigi
import torch

from pipeline import PerplexityRun
from pipeline.errors import UserError
from pipeline.model.executor import WindowExecutor
from pipeline.store import outputs

from .helpers import HEAD40K, run_pipeline

PARAMS = dict(task="wikitext-2", corpus=str(HEAD40K), ctx=64, chunks=4, sequences_per_chunk=2, window_layers=0,
              device="cpu")


def test_out_of_memory_mid_pass_is_one_line_and_keeps_the_chunks(tmp_path, monkeypatch):
    reference = run_pipeline(tmp_path / "reference", **PARAMS)
    whole = WindowExecutor.__call__
    calls = []

    def second_chunk_runs_out(self, hidden, **inputs):
        calls.append(1)
        if len(calls) == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 12.00 GiB total)")
        return whole(self, hidden, **inputs)
    monkeypatch.setattr(WindowExecutor, "__call__", second_chunk_runs_out)
    failures = []
    handlers = luigi.Task._event_callbacks.setdefault(PerplexityRun, {}).setdefault(luigi.Event.FAILURE, set())
    record = lambda task, error: failures.append(error)  # noqa: E731
    handlers.add(record)
    try:
        root = tmp_path / "runs"
        task = PerplexityRun(run_root=str(root), **PARAMS)
        assert not luigi.build([task], local_scheduler=True, log_level="CRITICAL")
    finally:
        handlers.discard(record)
    (error,) = failures
    assert isinstance(error, UserError) and "\n" not in str(error)
    assert str(error).startswith("LayerWindow [0..30) cpu: the device ran out of memory (CUDA out of memory. ")
    (recorded,) = (root / "LayerWindow").glob("*.failed.json")      # the window's failure, beside its output
    assert str(error) in recorded.read_text()
    (partial,) = (root / "LayerWindow").glob("*.partial")
    assert (partial / "journal.log").read_text().splitlines() == ["computing 0", "wrote 0", "computing 1"]

    monkeypatch.setattr(WindowExecutor, "__call__", whole)
    luigi.task_register.Register.clear_instance_cache()
    again = run_pipeline(root, **PARAMS)
    assert again["mean_nll"] == reference["mean_nll"]
    (window,) = (root / "LayerWindow").iterdir()
    assert outputs.read_manifest(window)["chunks_found"] == 1
