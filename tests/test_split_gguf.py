"""A model published in parts (gguf-split's NAME-0000K-of-0000N.gguf) is one model: the same
numbers as the whole file, and every part that does not belong refused in one line."""
import shutil

import pytest
import torch

from pipeline.errors import UserError
from pipeline.gguf_io.reader import GGUFIndex
from pipeline.gguf_io.registry import resolve_model

from .helpers import HEAD40K, assert_one_line_error, hidden_after, luigi_cli, run_pipeline
from .tiny_gguf import rewrite_gguf, write_tiny_gguf

SPLITS = {
    "by-tensors": dict(split_max_tensors=100),                               # 273 tensors: 3 parts
    "by-size-empty-first": dict(split_max_size=40 << 20, small_first_shard=True),  # metadata alone in part 1
}


@pytest.fixture(scope="module")
def smollm(tmp_path_factory, model_path):
    return model_path("smollm2-135m"), tmp_path_factory.mktemp("split")


def parts(folder, stem):
    return sorted(folder.glob(f"{stem}-*-of-*.gguf"))


@pytest.mark.parametrize("how", list(SPLITS))
def test_a_split_model_gives_the_whole_files_numbers_cycled_and_whole(how, smollm, tmp_path):
    whole, folder = smollm
    rewrite_gguf(whole, folder / f"{how}.gguf", **SPLITS[how])
    split = parts(folder, how)
    assert len(split) >= 3
    index = GGUFIndex(split[-1])   # any part opens the model, from its first part
    assert index.path == split[0] and index.parts == split
    assert len({t.part for t in index.tensors.values()}) == len(split) - (how == "by-size-empty-first")
    common = dict(task="wikitext-2", corpus=str(HEAD40K), ctx=64, chunks=2)
    for window_layers in (0, 7):
        reference = run_pipeline(tmp_path / "whole", model=str(whole), window_layers=window_layers, **common)
        result = run_pipeline(tmp_path / how, model=str(folder / how), window_layers=window_layers, **common)
        assert result["mean_nll"] == reference["mean_nll"] and result["ppl"] == reference["ppl"]
        assert result["model"]["path"] == str(split[0]) and result["model"]["parts"] == [str(p) for p in split]
        assert result["model"]["id"] != reference["model"]["id"]
        assert result["model"]["content_sha256"] != reference["model"]["content_sha256"]


def test_a_split_moe_runs_in_expert_slices_as_the_whole_file(tiny_model, tmp_path):
    """Experts read slice by slice from their parts: the whole file's hidden state, bit for bit."""
    _, path = tiny_model("qwen3moe")
    rewrite_gguf(path, tmp_path / "moe.gguf", split_max_tensors=2)
    split = parts(tmp_path, "moe")
    assert len({GGUFIndex(split[0]).tensors[f"blk.0.ffn_{r}_exps.weight"].part for r in ("gate", "up", "down")}) > 1
    for slices in (1, 3):
        assert torch.equal(hidden_after(split[0], slices), hidden_after(path, slices))


@pytest.fixture
def tiny_split(tmp_path):
    """An 11-tensor model in three parts (4, 4, 3), and a second split of it in four parts."""
    tiny = write_tiny_gguf(tmp_path / "tiny.gguf")
    rewrite_gguf(tiny, tmp_path / "m.gguf", split_max_tensors=4)
    (tmp_path / "other").mkdir()
    rewrite_gguf(tiny, tmp_path / "other" / "m.gguf", split_max_tensors=3)
    return parts(tmp_path, "m"), parts(tmp_path / "other", "m")


def swap(a, b):
    tmp = a.with_name("swap")
    a.rename(tmp)
    b.rename(a)
    tmp.rename(b)


def test_every_part_is_read_and_the_prefix_names_the_model(tiny_split, tmp_path):
    split, _ = tiny_split
    assert len(split) == 3 and GGUFIndex(split[1]).parts == split
    assert len(GGUFIndex(split[0]).tensors) == len(GGUFIndex(tmp_path / "tiny.gguf").tensors) == 11
    assert resolve_model(str(tmp_path / "m")) == split[0]


@pytest.mark.parametrize("damage, message", [
    (lambda split, other: split[1].unlink(), "part 2 of 3 of m-00001-of-00003.gguf is missing"),
    (lambda split, other: shutil.copyfile(split[2], split[0].with_name("m-00004-of-00003.gguf")),
     "m-00004-of-00003.gguf is not one of the 3 parts of m-00001-of-00003.gguf: an extra part"),
    (lambda split, other: swap(split[1], split[2]),
     "m-00002-of-00003.gguf says it is part 3 of 3, where part 2 of 3 belongs"),
    (lambda split, other: shutil.copyfile(other[1], split[1]),
     "m-00002-of-00003.gguf says it is part 2 of 4, where part 2 of 3 belongs"),
    (lambda split, other: shutil.copyfile(split[0].with_name("tiny.gguf"), split[2]),
     "m-00003-of-00003.gguf is not a part of a split GGUF, where part 3 of 3 belongs"),
    (lambda split, other: split[0].rename(split[0].with_name("renamed.gguf")), "is missing"),
])
def test_a_part_that_does_not_belong_is_refused_in_one_line(damage, message, tiny_split, tmp_path):
    split, other = tiny_split
    damage(split, other)
    with pytest.raises(UserError, match=message):
        GGUFIndex(split[0] if split[0].exists() else split[-1])


def test_parts_of_another_split_with_the_same_count(tmp_path):
    """Two splits of one model into three parts at other places: a tensor in two parts, or a
    count of tensors other than the first part's."""
    tiny = write_tiny_gguf(tmp_path / "tiny.gguf")
    for folder, per_part in (("a", 5), ("b", 4)):
        (tmp_path / folder).mkdir()
        rewrite_gguf(tiny, tmp_path / folder / "m.gguf", split_max_tensors=per_part)
    a, b = parts(tmp_path / "a", "m"), parts(tmp_path / "b", "m")
    assert len(a) == len(b) == 3
    shutil.copyfile(b[1], a[1])   # a's part 2 holds tensors 5-9, b's 4-7: tensor 4 twice
    with pytest.raises(UserError, match=r"tensor \S+ is in both .*m-00001-of-00003.gguf and .*m-00002-of-00003.gguf"):
        GGUFIndex(a[0])
    rewrite_gguf(tiny, tmp_path / "c.gguf", split_max_tensors=4,
                 transform=lambda n, q, d: None if n == "blk.0.ffn_down.weight" else (d, q))
    shutil.copyfile(parts(tmp_path, "c")[0], b[0])   # b's first four tensors, 10 promised, 11 found
    with pytest.raises(UserError, match="says its 3 parts hold 10 tensors; they hold 11"):
        GGUFIndex(b[0])


def test_a_misnamed_first_part_and_two_sets_under_one_prefix(tiny_split, tmp_path):
    split, _ = tiny_split
    shutil.copyfile(split[0], tmp_path / "first.gguf")
    with pytest.raises(UserError, match="first.gguf is part 1 of 3 of a split GGUF but is not named "
                                        "NAME-00001-of-00003.gguf"):
        GGUFIndex(tmp_path / "first.gguf")
    shutil.copyfile(split[0], tmp_path / "m-00001-of-00002.gguf")
    with pytest.raises(UserError, match="names 2 split models"):
        resolve_model(str(tmp_path / "m"))


def test_a_missing_part_through_the_luigi_command(tiny_split, tmp_path):
    split, _ = tiny_split
    split[2].unlink()
    done = luigi_cli("--model", str(tmp_path / "m"), "--ctx", "16", run_root=tmp_path / "runs")
    assert_one_line_error(done, "part 3 of 3 of m-00001-of-00003.gguf is missing")
