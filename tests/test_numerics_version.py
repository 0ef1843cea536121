"""Every output's identity carries the numerics version: raising the package's renames every
output, raising a family's renames what its layers compute, raising the scoring's renames the
Score outputs alone, and unchanged code reuses the run root as it is."""
import luigi

from pipeline import numerics
from pipeline.model.arch.llama import Llama

from .helpers import HEAD40K, run_pipeline, tree_digest

PARAMS = dict(task="wikitext-2", corpus=str(HEAD40K), ctx=64, chunks=2, window_layers=15)


def outputs_of(root) -> dict[str, set[str]]:
    return {d.name: {o.name for o in d.iterdir() if (o / "manifest.json").is_file()}
            for d in root.iterdir() if d.is_dir() and not d.name.startswith(".")}


def rerun(root) -> dict:
    luigi.task_register.Register.clear_instance_cache()   # task objects name their outputs once
    return run_pipeline(root, **PARAMS)


def test_raising_a_version_renames_what_it_computes_and_nothing_else(tmp_path, monkeypatch):
    first = rerun(tmp_path)
    before, digest = outputs_of(tmp_path), tree_digest(tmp_path)
    assert rerun(tmp_path)["ppl"] == first["ppl"]
    assert outputs_of(tmp_path) == before and tree_digest(tmp_path) == digest   # unchanged code: all reused

    monkeypatch.setattr(Llama, "numerics", Llama.numerics + 1)
    rerun(tmp_path)
    after = outputs_of(tmp_path)
    assert after["Tokenize"] == before["Tokenize"]                   # no layer of the family in it
    for family in ("Embed", "LayerWindow", "Score"):
        assert after[family] - before[family], family                # new folders beside the old
    assert len(after["LayerWindow"]) == len(before["LayerWindow"]) + 2

    monkeypatch.setattr(numerics, "SCORING", numerics.SCORING + 1)
    rerun(tmp_path)
    scored = outputs_of(tmp_path)
    assert len(scored["Score"]) == len(after["Score"]) + 1
    assert {k: v for k, v in scored.items() if k != "Score"} == {k: v for k, v in after.items() if k != "Score"}

    monkeypatch.setattr(numerics, "VERSION", numerics.VERSION + 1)
    rerun(tmp_path)
    assert len(outputs_of(tmp_path)["Tokenize"]) == 2
