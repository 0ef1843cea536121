"""Output identities: what changes the numbers changes the path, what does not, does not."""
import json
import time

import numpy as np
import pytest

from pipeline.errors import UserError
from pipeline.flow.score import Score
from pipeline.flow.trunk import Embed, LayerWindow, Tokenize
from pipeline.gguf_io.reader import GGUFIndex
from pipeline.gguf_io.tokenizer import load_tokenizer
from pipeline.run.tokens_file import read_tokens_file

from .helpers import HEAD40K, run_pipeline

COMMON = dict(task="wikitext-2", corpus=str(HEAD40K), placement="cpu:0:4,cpu:4:30")


def test_ctx_and_layers_change_every_downstream_path(tmp_path):
    a = LayerWindow(run_root=str(tmp_path), ctx=128, first=4, last=30, **COMMON)
    b = LayerWindow(run_root=str(tmp_path), ctx=256, first=4, last=30, **COMMON)
    assert a.out_dir() != b.out_dir()
    assert a.requires().out_dir() != b.requires().out_dir()  # the window [0, 4) too
    other_split = LayerWindow(run_root=str(tmp_path), ctx=128, first=4, last=30,
                              **{**COMMON, "placement": "cpu:0:2,cpu:2:4,cpu:4:30"})
    assert other_split.out_dir() != a.out_dir()  # its upstream chain differs


def test_device_does_not_change_tokenize_or_embed_paths(tmp_path):
    cpu = Score(run_root=str(tmp_path), ctx=128, **COMMON)
    assert Embed(run_root=str(tmp_path), ctx=128, **COMMON).out_dir() == cpu.clone(Embed).out_dir()
    assert Tokenize(run_root=str(tmp_path), ctx=128, task="wikitext-2", corpus=str(HEAD40K)).out_dir() \
        == cpu.clone(Tokenize).out_dir()


def test_the_former_name_of_sequences_per_chunk_is_the_same_option(tmp_path):
    import luigi.cmdline_parser

    def task(*args):
        with luigi.cmdline_parser.CmdlineParser.global_instance(["Tokenize", "--run-root", str(tmp_path), *args]) as cp:
            return cp.get_task_obj()

    new = task("--sequences-per-chunk", "2")
    assert new.out_dir() != task().out_dir()  # the option changes the chunking
    assert task("--windows-per-chunk", "2").out_dir() == new.out_dir()
    assert Tokenize(run_root=str(tmp_path), windows_per_chunk=2).out_dir() == new.out_dir()
    assert task("--windows-per-chunk", "2", "--sequences-per-chunk", "2").out_dir() == new.out_dir()
    with pytest.raises(UserError, match="former name of --sequences-per-chunk, give one"):
        task("--windows-per-chunk", "2", "--sequences-per-chunk", "3").check_renamed()


def test_params_json_beside_each_output(tmp_path):
    run_pipeline(tmp_path, task="wikitext-2", corpus=str(HEAD40K), ctx=128, chunks=2, window_layers=15)
    params = sorted(tmp_path.glob("*/*/params.json"))
    assert {p.parent.parent.name for p in params} == {"Tokenize", "Embed", "LayerWindow", "Score"}
    assert all(json.loads(p.read_text())["identity"] for p in params)
    assert not list(tmp_path.glob("*/*.partial"))


def test_tokens_file_equals_the_corpus(tmp_path, model_path):
    ids = load_tokenizer(GGUFIndex(model_path("smollm2-135m"))).encode(HEAD40K.read_text(encoding="utf-8"))
    np.save(tmp_path / "ids.npy", np.array(ids, dtype=np.int32))
    common = dict(ctx=128, chunks=3, window_layers=0)
    from_text = run_pipeline(tmp_path / "a", task="wikitext-2", corpus=str(HEAD40K), **common)
    from_ids = run_pipeline(tmp_path / "b", tokens_file=str(tmp_path / "ids.npy"), **common)
    assert from_ids["mean_nll"] == from_text["mean_nll"]
    assert from_ids["corpus"]["tokens"] == len(ids)


@pytest.mark.parametrize("name", ["ids.txt", "ids.npy"])
def test_dumped_tokens_give_the_same_numbers(name, tmp_path):
    """--dump-tokens writes the corpus's ids as the run tokenized them (BOS included where asked):
    every id, in the form --tokens-file reads, and a run from it scores the same."""
    common = dict(ctx=128, chunks=2, window_layers=0, bos="yes")
    from_text = run_pipeline(tmp_path / "a", task="wikitext-2", corpus=str(HEAD40K), dump_tokens=str(tmp_path / name),
                             **common)
    dumped = read_tokens_file(str(tmp_path / name))
    assert dumped.size == from_text["corpus"]["tokens"] > 2 * 128 and dumped[0] == 1   # SmolLM2's BOS
    from_ids = run_pipeline(tmp_path / "b", tokens_file=str(tmp_path / name), **common)
    assert from_ids["mean_nll"] == from_text["mean_nll"] and from_ids["tokens_scored"] == from_text["tokens_scored"]


def test_bos_and_unscored_prefix_options(tmp_path):
    common = dict(task="wikitext-2", corpus=str(HEAD40K), ctx=128, chunks=2, window_layers=0)
    plain = run_pipeline(tmp_path, **common)
    with_bos = run_pipeline(tmp_path, bos="yes", **common)
    assert with_bos["mean_nll"] != plain["mean_nll"]
    wide = run_pipeline(tmp_path, unscored_prefix=16, **common)
    assert wide["tokens_scored"] == 2 * (128 - 17)


def test_a_task_finished_by_another_process_is_not_redone(tmp_path):
    first = run_pipeline(tmp_path, task="wikitext-2", corpus=str(HEAD40K), ctx=128, chunks=2, window_layers=0)
    tokenize = Tokenize(run_root=str(tmp_path), task="wikitext-2", corpus=str(HEAD40K), ctx=128, chunks=2)
    manifest = (tokenize.out_dir() / "manifest.json").read_text()
    tokenize.run()  # as if scheduled before the other process completed it
    assert (tokenize.out_dir() / "manifest.json").read_text() == manifest
    assert run_pipeline(tmp_path, task="wikitext-2", corpus=str(HEAD40K), ctx=128, chunks=2,
                        window_layers=0)["mean_nll"] == first["mean_nll"]


def test_long_tasks_report_progress_through_luigi(tmp_path, monkeypatch):
    from luigi.scheduler import Scheduler

    messages, percents = {}, {}
    original = Scheduler.set_task_status_message, Scheduler.set_task_progress_percentage

    def status(self, task_id, status_message):
        messages.setdefault(task_id.split("_")[0], []).append(status_message)
        return original[0](self, task_id, status_message)

    def percent(self, task_id, progress_percentage):
        percents.setdefault(task_id.split("_")[0], []).append(progress_percentage)
        return original[1](self, task_id, progress_percentage)
    monkeypatch.setattr(Scheduler, "set_task_status_message", status)
    monkeypatch.setattr(Scheduler, "set_task_progress_percentage", percent)
    run_pipeline(tmp_path, ctx=64, chunks=4, sequences_per_chunk=2, window_layers=15)
    assert messages["LayerWindow"][0].startswith("LayerWindow [0..15) cpu: chunk 1/2, ")
    assert "tok/s" in messages["Score"][-1] and messages["Score"][-1].endswith("s left")
    assert percents["Embed"] == [50, 100] and percents["Score"] == [50, 100]
    assert percents["LayerWindow"] == [50, 100] * 2
    # the pass-level part: layers done of the trunk's 30, after the first window's first chunk
    assert "; pass 7.5/30 layers, " in messages["LayerWindow"][0]
    assert "; pass 30.0/30 layers, " in messages["LayerWindow"][-1] and messages["LayerWindow"][-1].endswith("0s left")


def test_a_window_counts_the_sweep_s_runs_without_a_request_per_chunk(tmp_path, monkeypatch):
    """The runs of a sweep still to come: a run found done is not looked at again, the others
    at most every RECOUNT_S seconds (on S3 each look is a HEAD request a run)."""
    import luigi

    from pipeline import PerplexityRun
    from pipeline.flow import trunk
    from pipeline.flow.output_task import under_root
    from pipeline.flow.sweep import record_runs
    from pipeline.store import outputs

    score = PerplexityRun(device="cpu", run_root=str(tmp_path), ctx=64, chunks=1).score_tasks(check_memory=False)[0]
    window = next(t for t in luigi.task.flatten(score.requires()) if isinstance(t, LayerWindow))
    record_runs(tmp_path, "grid.toml", [{"scores": ["Score/a"], "outputs": [under_root(tmp_path, window)]},
                                        {"scores": ["Score/b"], "outputs": []}, {"scores": ["Score/c"], "outputs": []}])
    looked, complete = [], {"Score/c"}
    monkeypatch.setattr(outputs, "is_complete",
                        lambda out: looked.append(out.name) or f"Score/{out.name}" in complete)
    now = [100.0]
    monkeypatch.setattr(trunk.time, "monotonic", lambda: now[0])
    assert [window.pass_position()[3] for _ in range(50)] == [1] * 50        # b to come; c done
    assert sorted(looked) == ["a", "b", "c"]                                 # one look, not 50
    complete.add("Score/b")
    now[0] += trunk.RECOUNT_S
    assert window.pass_position()[3] == 0
    assert sorted(looked) == ["a", "a", "b", "b", "c"]                       # c, found done, not again


def test_the_pass_line_estimates_the_pass_and_the_sweep():
    from pipeline.flow.console import duration, pass_line

    # window [12..24) of 48 layers, 3 of 8 chunks done at 10 s a chunk (50 s left of it), 40 tok/s
    line = pass_line(12, 12, 48, 0, 3, 8, 40.0, 10.0, 50.0)
    # 24 layers after the window x 8 chunks x 10/12 s a layer-chunk = 160 s, + 50 s
    assert line == "pass 16.5/48 layers, 10 tok/s, 3m30s left"
    # two more passes like it: 2 x 48 x 8 x 10/12 = 640 s more
    assert pass_line(12, 12, 48, 2, 3, 8, 40.0, 10.0, 50.0).endswith("; sweep 14m10s left (2 more runs)")
    # the window's load took 24 s (2 s a layer): once for each of the 24 layers after it, not per chunk
    assert pass_line(12, 12, 48, 0, 3, 8, 40.0, 10.0, 50.0, 24.0) == "pass 16.5/48 layers, 10 tok/s, 4m18s left"
    assert pass_line(12, 12, 48, 2, 3, 8, 40.0, 10.0, 50.0, 24.0).endswith("; sweep 18m10s left (2 more runs)")
    assert [duration(s) for s in (4.4, 725, 11220)] == ["4s", "12m05s", "3h07m"]


def test_the_pace_of_a_window_counts_no_load(tmp_path):
    """A window whose load takes long and whose chunks are quick: the pace after its first chunk
    is the chunks' (the load is reported once), not the load spread over one chunk."""
    from pipeline.store.arrays import ChunkedArray
    from pipeline.store.chunk_writer import fill

    seen = []

    def load():
        time.sleep(1.0)
        return lambda i, data: data

    out = ChunkedArray.create(tmp_path / "a.zarr", (4, 8, 2), 1, "float32", {})
    fill(out, lambda i: np.zeros((1, 8, 2), np.float32), load, "t",
         progress=lambda done, total, computed, tokens, started, load_s: seen.append(
             (time.time() - started, load_s)))
    spent, load_s = seen[0]
    assert load_s >= 1.0 and spent < 0.5
