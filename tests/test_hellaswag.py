"""HellaSwag as llama-perplexity scores it: its task order, its file, the plan of sequences, and
its per-task running accuracy on a real model."""
import hashlib
import json

import numpy as np
import pytest

from pipeline.errors import UserError
from pipeline.paths import REPO_ROOT
from pipeline.run.modes.choice import PACKED_ROW
from pipeline.run.modes.hellaswag import read_tasks, wilson_interval
from pipeline.run.modes.task_order import llama_task_order

from .helpers import assert_one_line_error, luigi_cli

TASKS_48 = REPO_ROOT / "data/corpora/hellaswag-val.head48.txt"
# llama-perplexity -m SmolLM2-135M-Instruct.Q4_1.gguf -f hellaswag-val.head48.txt --hellaswag
# --hellaswag-tasks 16 -c 512 -t 2 -fa off (tests/data/llama-perplexity.md): per task, the running
# acc_norm and its 95% interval
LLAMA_16 = """\
1	0.00000000%	[0.0000%, 79.3451%]
2	0.00000000%	[0.0000%, 65.7620%]
3	0.00000000%	[0.0000%, 56.1497%]
4	25.00000000%	[4.5587%, 69.9358%]
5	20.00000000%	[3.6224%, 62.4465%]
6	16.66666667%	[3.0053%, 56.3503%]
7	14.28571429%	[2.5680%, 51.3128%]
8	25.00000000%	[7.1479%, 59.0725%]
9	22.22222222%	[6.3225%, 54.7411%]
10	20.00000000%	[5.6682%, 50.9838%]
11	18.18181818%	[5.1368%, 47.6981%]
12	16.66666667%	[4.6965%, 44.8031%]
13	23.07692308%	[8.1795%, 50.2564%]
14	28.57142857%	[11.7214%, 54.6491%]
15	26.66666667%	[10.8975%, 51.9504%]
16	25.00000000%	[10.1821%, 49.4983%]
"""


def test_task_order_is_libstdcxx_mt19937():
    # printed by a C++ program (g++ 12.2, libstdc++) drawing as llama-perplexity does:
    # std::mt19937 rng(1); per task std::uniform_int_distribution<size_t>(0, left - 1)(rng)
    assert llama_task_order(24, 24) == [10, 23, 16, 21, 0, 3, 7, 22, 4, 6, 2, 12, 8, 13, 11, 18, 14, 20, 15,
                                        19, 5, 1, 17, 9]
    assert llama_task_order(1267, 5) == [528, 1263, 912, 1180, 0]
    order = llama_task_order(10042, 400)
    assert order[:10] == [4187, 10013, 7233, 9363, 1, 1286, 3036, 10032, 1474, 2371]
    # the whole list as that program printed it ("%zu " each, then a newline)
    printed = "".join(f"{i} " for i in order) + "\n"
    assert hashlib.sha256(printed.encode()).hexdigest() == \
        "c6df4e1f987e9167ec3d93541149739eb355980da977d1f69037cb58445f2dab"
    assert llama_task_order(5, 9) == llama_task_order(5, 5)        # more asked than there are: all


def test_wilson_interval_as_llama_perplexity_prints_it():
    # its line after 4 of 16 tasks right, above
    low, high = wilson_interval(4, 16)
    assert f"[{100 * low:3.4f}%, {100 * high:3.4f}%]" == "[10.1821%, 49.4983%]"


@pytest.mark.parametrize("text,match", [
    ("ctx\n1\na\nb\nc\n", "not a multiple of 6"),
    ("ctx\n4\na\nb\nc\nd\n", "gold ending's index"),
    ("ctx\nx\na\nb\nc\nd\n", "gold ending's index"),
])
def test_malformed_task_files_are_refused(text, match):
    with pytest.raises(UserError, match=match):
        read_tasks(text, "f.txt")


def test_read_tasks_keeps_lines_as_getline_does():
    tasks = read_tasks(TASKS_48.read_text(), "head48")
    assert len(tasks) == 48
    assert tasks[0] == ("Roof shingle removal: A man is sitting on a roof. He", 3,
                        ["is using wrap to wrap a pair of skis.", "is ripping level tiles off.",
                         "is holding a rubik's cube.", "starts pulling up roofing on a roof."])


def test_a_file_is_read_as_llama_perplexity_reads_it(tmp_path):
    """As llama-perplexity reads -f: its final newline dropped (a file ending in a blank line holds
    whole tasks) and CRs kept (CRLF line ends: each line ends in a CR)."""
    from pipeline.run.evaltask import load_eval_task
    from pipeline.run.modes.hellaswag import HellaSwag

    task, path = load_eval_task("hellaswag"), tmp_path / "h.txt"
    path.write_bytes(b"A man sits. He\n0\nstands up.\nsits down.\nlies down.\nleaves.\n\n")
    assert read_tasks(*HellaSwag().content(task, str(path))) == [
        ("A man sits. He", 0, ["stands up.", "sits down.", "lies down.", "leaves."])]
    path.write_bytes(b"A man sits. He\r\n1\r\nstands up.\r\nsits down.\r\nlies down.\r\nleaves.\r\n")
    assert read_tasks(*HellaSwag().content(task, str(path))) == [
        ("A man sits. He\r", 1, ["stands up.\r", "sits down.\r", "lies down.\r", "leaves.\r"])]


@pytest.mark.parametrize("split", [False, True])
def test_plan_scores_what_the_endings_do_not_share(split):
    """Each task's endings packed in a row (the tokens they share, then each ending's own as a
    branch); with --ctx below a task's width (`split`), its endings over parts, each with the
    shared tokens again; every ending's sequence, positions and scored span as its own row's."""
    from pipeline.gguf_io.reader import open_gguf
    from pipeline.gguf_io.tokenizer import load_tokenizer
    from pipeline.run.modes import mode_of
    from pipeline.run.spec import resolve_run

    tokenizer = load_tokenizer(open_gguf(str(resolve_run("smollm2-135m", "python-docs", "", "", "", 0, 0, -1, -1,
                                                         "auto").model_path)))
    tasks = read_tasks(TASKS_48.read_text(), "head48")
    order = llama_task_order(48, 3)
    seqs = [[tokenizer.encode(f"{tasks[i][0]} {e}") for e in tasks[i][2]] for i in order]
    ctx = max(map(len, sum(seqs, []))) if split else 0
    spec = resolve_run("smollm2-135m", "python-docs", "", "", "", ctx, 0, -1, -1, "auto", str(TASKS_48), 3)
    made = mode_of("hellaswag").plan(spec)
    plan = made.sequences
    assert [t["index"] for t in made.attrs["hellaswag"]["tasks"]] == order and len(plan.score_lo) == 12
    parts, widths = set(), []
    for t in range(3):
        shared = next(k for k in range(len(seqs[t][0])) if len({tuple(s[:k + 1]) for s in seqs[t]}) > 1)
        widths.append(shared + sum(len(s) - shared for s in seqs[t]))
        for e, seq in enumerate(seqs[t]):
            span = 4 * t + e
            row, lo, hi = plan.rows()[span], plan.score_lo[span], plan.score_hi[span]
            position, sequence, branch = plan.layout[row].T
            parts.add((row, sequence[lo]))
            mine = np.flatnonzero((sequence == sequence[lo]) & ((branch == 0) | (branch == branch[lo])))
            np.testing.assert_array_equal(plan.ids[row, mine], seq)
            np.testing.assert_array_equal(position[mine], np.arange(len(seq)))
            assert (lo, hi, plan.sources()[span]) == (mine[shared], mine[-1] + 1, mine[shared - 1])
            assert (branch[mine[:shared]] == 0).all() and (branch[mine[shared:]] > 0).all()
    assert len(parts) > 3 if split else len(parts) == 3
    # where not given, rows of 512 positions, or of the widest task (its shared tokens once)
    assert spec.method.ctx == (ctx or max(PACKED_ROW, max(widths)))


def test_running_accuracy_equals_llama_perplexity(tmp_path):
    out = luigi_cli("--hellaswag", str(TASKS_48), "--hellaswag-tasks", "16", "--result-json", str(tmp_path / "r.json"),
                    run_root=tmp_path)
    assert out.returncode == 0, out.stderr
    printed = "".join(line + "\n" for line in out.stdout.splitlines() if line[:1].isdigit() and "\t" in line)
    assert printed == LLAMA_16
    result = json.loads((tmp_path / "r.json").read_text())["hellaswag"]
    assert result["tasks"] == 16 and result["available"] == 48 and result["accuracy"] == 25.0
    assert [t["index"] for t in result["per_task"]] == llama_task_order(48, 16)
    # cycled, windows of 7 layers: every ending's score bit for bit
    luigi_cli("--hellaswag", str(TASKS_48), "--hellaswag-tasks", "16", "--window-layers", "7",
              "--result-json", str(tmp_path / "c.json"), run_root=tmp_path)
    cycled = json.loads((tmp_path / "c.json").read_text())["hellaswag"]
    assert [t["logprobs"] for t in cycled["per_task"]] == [t["logprobs"] for t in result["per_task"]]


@pytest.mark.parametrize("extra,match", [
    (["--chunks", "4"], "--hellaswag-tasks"), (["--method", "stride"], "no --method"),
    (["--kl-base", "smollm2-135m"], "--kl-base"), (["--ctx", "16"], "raise --ctx"),
])
def test_options_that_do_not_apply_are_refused(tmp_path, extra, match):
    assert_one_line_error(luigi_cli("--hellaswag", str(TASKS_48), *extra, run_root=tmp_path), match)


def test_hellaswag_task_out_of_the_box():
    from pipeline.run.eval_data import dataset_file
    from pipeline.run.modes import mode_of
    from pipeline.run.spec import resolve_run

    text = dataset_file("hellaswag").read_text()     # fetched, converted and its sha256 checked on first use
    assert len(read_tasks(text, "val")) == 10042
    assert text.startswith(TASKS_48.read_text())    # the shipped head is its first 48 tasks
    spec = resolve_run("smollm2-135m", "hellaswag", "", "", "", 0, 0, -1, -1, "auto", "", 4)
    tasks = mode_of(spec.method.name).plan(spec).attrs["hellaswag"]["tasks"]
    assert [t["index"] for t in tasks] == [4187, 10013, 7233, 9363]
