"""Bad input: a non-zero exit, one line naming the problem, no traceback, nothing completed changed."""
import errno
import fcntl
import shutil

import luigi
from gguf import GGMLQuantizationType

from pipeline import LayerWindow, Tokenize
from pipeline.store import outputs
from pipeline.store.arrays import ChunkedArray

from .helpers import HEAD40K, assert_one_line_error, luigi_cli, run_pipeline, small_disk, tree_digest
from .tiny_gguf import write_tiny_gguf

SMALL = ["--task", "wikitext-2", "--corpus", str(HEAD40K), "--ctx", "128", "--chunks", "4", "--window-layers", "10",
         "--sequences-per-chunk", "2"]
SMALL_PARAMS = dict(task="wikitext-2", corpus=str(HEAD40K), ctx=128, chunks=4, window_layers=10, sequences_per_chunk=2)


def ids_file(tmp_path, n=600):
    path = tmp_path / "ids.txt"
    path.write_text(" ".join(str(i % 64) for i in range(n)))
    return str(path)


def test_truncated_gguf(tmp_path, model_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(model_path("smollm2-135m").read_bytes()[:5_000_000])
    assert_one_line_error(luigi_cli("--model", str(cut), run_root=tmp_path), "truncated")


def test_not_a_gguf_file(tmp_path):
    bogus = tmp_path / "model.gguf"
    bogus.write_text("not a model\n" * 100)
    assert_one_line_error(luigi_cli("--model", str(bogus), run_root=tmp_path), "not a GGUF file")


def test_unknown_architecture(tmp_path):
    model = write_tiny_gguf(tmp_path / "m.gguf", arch="mamba9")
    done = luigi_cli("--model", str(model), "--tokens-file", ids_file(tmp_path), "--ctx", "128", run_root=tmp_path)
    assert_one_line_error(done, "architecture 'mamba9' is not supported")


def test_unsupported_tensor_type_names_tensor_and_type(tmp_path):
    model = write_tiny_gguf(tmp_path / "m.gguf", ffn_up_type=GGMLQuantizationType.Q8_1)
    done = luigi_cli("--model", str(model), "--tokens-file", ids_file(tmp_path), "--ctx", "128", run_root=tmp_path)
    assert_one_line_error(done, "blk.0.ffn_up.weight has GGML type Q8_1")


def test_windows_that_do_not_tile(tmp_path):
    assert_one_line_error(luigi_cli("--gpu-layers", "40", run_root=tmp_path), "does not fit")


def test_an_option_under_both_its_names(tmp_path):
    done = luigi_cli("--windows-per-chunk", "2", "--sequences-per-chunk", "3", run_root=tmp_path)
    assert_one_line_error(done, "--windows-per-chunk is the former name of --sequences-per-chunk")


def test_unwritable_run_root(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file, not a folder")
    assert_one_line_error(luigi_cli("--chunks", "2", run_root=blocker / "runs"), "cannot write under")


def test_boundary_from_another_run(tmp_path):
    run_pipeline(tmp_path, keep_boundaries=True, **SMALL_PARAMS)
    params = {k: v for k, v in SMALL_PARAMS.items() if k != "window_layers"}
    ours = LayerWindow(run_root=str(tmp_path), bos="yes", placement="cpu:0:10,cpu:10:20,cpu:20:30",
                       first=0, last=10, **params)
    # the other run's window of the same layers (the same weights: only the boundary tells them apart)
    foreign = next(d for d in (tmp_path / "LayerWindow").iterdir()
                   if d.name != ours.out_dir().name and outputs.read_manifest(d)["identity"]["layers"] == [0, 10])
    before = tree_digest(tmp_path)
    shutil.copytree(foreign, ours.out_dir())  # a completed window of the other run, in our place
    done = luigi_cli(*SMALL, "--bos", "yes", run_root=tmp_path)
    assert_one_line_error(done, "was written by another run")
    after = tree_digest(tmp_path)
    assert {k: v for k, v in after.items() if k in before} == before


def test_corrupted_chunk_of_a_completed_boundary(tmp_path):
    run_pipeline(tmp_path, keep_boundaries=True, **SMALL_PARAMS)
    layers = {d: ChunkedArray.open(d / "boundary.zarr").attrs["identity"]["layers"]
              for d in (tmp_path / "LayerWindow").iterdir()}
    first = next(d for d, lay in layers.items() if lay == [0, 10])
    for d, lay in layers.items():  # the later windows and the score must be recomputed
        if lay != [0, 10]:
            shutil.rmtree(d)
    shutil.rmtree(tmp_path / "Score")
    chunk = first / "boundary.zarr" / "c" / "1" / "0" / "0"
    data = bytearray(chunk.read_bytes())
    data[100] ^= 0xFF
    chunk.write_bytes(bytes(data))
    before = tree_digest(tmp_path)
    assert_one_line_error(luigi_cli(*SMALL, run_root=tmp_path), "is corrupted")
    assert tree_digest(tmp_path) == before


def test_second_process_on_the_same_task(tmp_path):
    params = {k: v for k, v in SMALL_PARAMS.items() if k != "window_layers"}
    tokenize = Tokenize(run_root=str(tmp_path), **params)
    out = tokenize.out_dir()
    lock = out.parent.parent / ".locks" / f"{out.parent.name}.{out.name}.lock"
    lock.parent.mkdir(parents=True)
    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert_one_line_error(luigi_cli(*SMALL, run_root=tmp_path), "already running in another process")


def test_full_disk_mid_pass_keeps_completed_chunks_and_resumes(tmp_path, monkeypatch, caplog):
    params = dict(task="wikitext-2", corpus=str(HEAD40K), ctx=128, chunks=8, sequences_per_chunk=2, window_layers=10)
    reference = run_pipeline(tmp_path / "reference", **params)
    writes = {"n": 0}
    real_write = ChunkedArray.write_chunk

    def write_until_full(self, i, data):
        writes["n"] += 1
        if writes["n"] == 7:  # the third chunk of the first window
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(self, i, data)

    monkeypatch.setattr(ChunkedArray, "write_chunk", write_until_full)
    from pipeline import PerplexityRun

    failed = luigi.build([PerplexityRun(run_root=str(tmp_path / "run"), device="cpu", **params)], local_scheduler=True,
                         detailed_summary=True)
    assert failed.status.name == "FAILED"
    lines = [r.getMessage() for r in caplog.records if "layercycle:" in r.getMessage()]
    assert len(lines) == 1 and "no space left" in lines[0] and not any(r.exc_info for r in caplog.records)
    monkeypatch.setattr(ChunkedArray, "write_chunk", real_write)
    resumed = run_pipeline(tmp_path / "run", **params)
    assert resumed["mean_nll"] == reference["mean_nll"]
    journal = next((tmp_path / "run" / "LayerWindow").glob("*/journal.log")).read_text()
    assert journal.count("computing") >= 4


def test_pass_larger_than_the_disk_is_refused(tmp_path):
    with small_disk(tmp_path / "small", "4m") as mnt:
        done = luigi_cli("--task", "wikitext-2", "--corpus", str(HEAD40K), "--ctx", "512", "--chunks", "8",
                         run_root=mnt / "runs")
        assert_one_line_error(done, "GiB are free")
