"""A window task interrupted between chunks resumes: it recomputes only the missing chunk
and the result is bit-identical to the uninterrupted run."""
import json
import shutil

from pipeline.store import outputs

from .helpers import HEAD40K, run_pipeline


def test_interrupted_window_recomputes_only_missing_chunks(tmp_path):
    params = dict(task="wikitext-2", corpus=str(HEAD40K), ctx=128, chunks=6, sequences_per_chunk=2, window_layers=10)
    first = run_pipeline(tmp_path, keep_boundaries=True, **params)
    windows = {json.loads((d / "manifest.json").read_text())["identity"]["layers"][0]: d
               for d in (tmp_path / "LayerWindow").iterdir()}
    # the state a kill leaves in window [10, 20) after its first two chunks: no manifest, a
    # half-written chunk file, nothing downstream
    middle = windows[10]
    (middle / outputs.MANIFEST).unlink()
    shutil.rmtree(windows[20]), shutil.rmtree(tmp_path / "Score")
    chunk = middle / "boundary.zarr" / "c" / "2" / "0" / "0"
    chunk.rename(chunk.with_name("0.1234abcd.partial"))
    middle.rename(outputs.partial_dir(middle))

    second = run_pipeline(tmp_path, **params)
    assert second["mean_nll"] == first["mean_nll"]
    assert outputs.read_manifest(middle)["chunks_computed"] == 1
    assert outputs.read_manifest(windows[0])["chunks_computed"] == 3  # untouched since the first run
    assert not list(middle.rglob("*.partial"))


def test_corrupted_chunk_in_a_partial_boundary_is_recomputed(tmp_path):
    params = dict(task="wikitext-2", corpus=str(HEAD40K), ctx=128, chunks=4, sequences_per_chunk=2, window_layers=0)
    first = run_pipeline(tmp_path, keep_boundaries=True, **params)
    (window,) = (tmp_path / "LayerWindow").iterdir()
    (window / outputs.MANIFEST).unlink()
    shutil.rmtree(tmp_path / "Score")
    chunk = window / "boundary.zarr" / "c" / "1" / "0" / "0"
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(bytes(data))
    window.rename(outputs.partial_dir(window))

    second = run_pipeline(tmp_path, **params)
    assert second["mean_nll"] == first["mean_nll"]
    assert outputs.read_manifest(window)["chunks_computed"] == 1


def test_consumed_boundaries_are_removed_unless_kept(tmp_path):
    params = dict(task="wikitext-2", corpus=str(HEAD40K), ctx=128, chunks=2, window_layers=10)
    first = run_pipeline(tmp_path / "a", **params)
    assert not list((tmp_path / "a").rglob("boundary.zarr"))
    again = run_pipeline(tmp_path / "a", **params)  # nothing recomputed: the result is complete
    assert again == first
    kept = run_pipeline(tmp_path / "b", keep_boundaries=True, **params)
    assert len(list((tmp_path / "b").rglob("boundary.zarr"))) == 4  # Embed + 3 windows
    assert kept["mean_nll"] == first["mean_nll"]


def test_a_resumed_task_counts_the_time_of_every_attempt(tmp_path):
    """A task killed and run again reports the compute of both attempts: the earlier one from
    its start to its journal's last line (its last chunk); the record is gone once complete."""
    import os
    import time

    out = tmp_path / "LayerWindow" / "0123"
    work = outputs.begin(out, {})
    assert outputs.earlier_attempts(work) == (0.0, 0)                  # the first attempt begins
    started = json.loads((work / outputs.ATTEMPTS).read_text())["started"]
    (work / "journal.log").write_text("computing 0\nwrote 0\n")
    os.utime(work / "journal.log", (started + 40, started + 40))     # its last chunk 40 s in, then killed
    seconds, count = outputs.earlier_attempts(outputs.begin(out, {}))
    assert (round(seconds, 6), count) == (40.0, 1)
    os.utime(work / "journal.log", (time.time() + 25, time.time() + 25))
    seconds, count = outputs.earlier_attempts(outputs.begin(out, {}))  # a third: 40 s and about 25 more
    assert count == 2 and 64 < seconds < 67
    outputs.commit(out, {"elapsed_s": seconds})
    assert sorted(p.name for p in out.iterdir()) == ["journal.log", "manifest.json", "params.json"]
