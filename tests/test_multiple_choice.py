"""Multiple choice as llama-perplexity scores it: llama.cpp's binary task file, read and written,
and ARC-Challenge's running accuracy on a real model."""
import re
import struct

import pytest

from pipeline.errors import UserError
from pipeline.run.multiple_choice_file import read_tasks, write_tasks

from .helpers import assert_one_line_error, luigi_cli

TASKS = [("Which is a fruit?", ["stone", "apple", "chair"], [0, 1, 0]),
         ("2 + 2 =", ["3", "4", "5", "22"], [0, 1, 0, 0])]


def test_file_layout_as_llama_perplexity_reads_it():
    data = write_tasks(TASKS)
    # uint32 count, uint32 offsets, then per task: question, answers, int32 labels, an empty second set
    n, first, second = struct.unpack_from("<3I", data)
    assert n == 2 and first == 12
    assert struct.unpack_from("<I", data, first)[0] == len("Which is a fruit?")
    assert data[second - 4:second] == b"\0\0\0\0"                 # the first task's empty multiple-answer set
    assert read_tasks(data, "f.bin") == TASKS


@pytest.mark.parametrize("cut,match", [
    (lambda d: d[:-3], "runs past the end|ends at byte"),
    (lambda d: struct.pack("<I", 0), "no tasks"),
    (lambda d: write_tasks([("q?", ["a", ""], [0, 1])]), "an empty question or answer"),
])
def test_malformed_files_are_refused(cut, match):
    with pytest.raises(UserError, match=match):
        read_tasks(cut(write_tasks(TASKS)), "f.bin")


def test_every_answer_labelled_1_is_right_and_a_task_with_none_is_counted():
    """llama-perplexity counts the choice right where its label is 1 (`mc1.labels[max_idx] == 1`),
    however many answers are; a task with none is scored and never right."""
    from pipeline.run.modes.multiple_choice import MultipleChoice

    tasks = [("Which are fruits?", ["stone", "apple", "pear"], [0, 1, 1]), ("Which is a colour?", ["x", "y"], [0, 0])]
    assert read_tasks(write_tasks(tasks), "f.bin") == tasks
    mode, encode = MultipleChoice(), lambda text: [1, *text.encode()]
    golds = [{"index": i, "gold": mode.tokenize(i, t, encode).gold} for i, t in enumerate(tasks)]
    assert [g["gold"] for g in golds] == [(1, 2), ()]
    picks = {"apple": [-3.0, -1.0, -2.0], "pear": [-3.0, -2.0, -1.0], "stone": [-1.0, -2.0, -3.0]}
    for pick, right in (("apple", 1), ("pear", 1), ("stone", 0)):
        result = mode.score_tasks(golds, [picks[pick], [-1.0, -2.0]])
        assert result["accuracy"] == pytest.approx(100 * right / 2)


# llama-perplexity -m SmolLM2-135M-Instruct.Q4_1.gguf -bf ARC_CHALLENGE_FIRST_TASKS.bin --multiple-choice
# -c 4096 -np 8 -t 2 -fa off -ctk f32 -ctv f32 (tests/data/llama-perplexity.md): the running accuracy per task
LLAMA_ARC = [
    "1\t0.00000000",
    "2\t50.00000000",
    "3\t66.66666667",
    "4\t50.00000000",
    "5\t60.00000000",
    "6\t50.00000000",
    "7\t42.85714286",
    "8\t50.00000000",
    "9\t55.55555556",
    "10\t50.00000000",
    "11\t45.45454545",
    "12\t41.66666667",
    "13\t38.46153846",
    "14\t35.71428571",
    "15\t33.33333333",
    "16\t31.25000000",
    "17\t29.41176471",
    "18\t27.77777778",
    "19\t26.31578947",
    "20\t25.00000000",
    "21\t23.80952381",
    "22\t22.72727273",
    "23\t26.08695652",
    "24\t25.00000000",
    "25\t28.00000000",
    "26\t30.76923077",
    "27\t29.62962963",
    "28\t28.57142857",
    "29\t27.58620690",
    "30\t26.66666667",
]


def test_arc_challenge_equals_llama_perplexity(tmp_path):
    from pipeline.run.eval_data import dataset_file

    first = read_tasks(dataset_file("arc-challenge").read_bytes(), "arc")[:len(LLAMA_ARC)]
    path = tmp_path / "arc.bin"
    path.write_bytes(write_tasks(first))
    done = luigi_cli("--multiple-choice", str(path), run_root=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if re.match(r"^\d+\t", line)]
    assert lines == LLAMA_ARC
    assert "Final result" in done.stdout and "Random chance" in done.stdout    # the whole file was scored


def test_binary_file_as_a_hellaswag_file_is_refused(tmp_path):
    path = tmp_path / "arc.bin"
    path.write_bytes(write_tasks(TASKS))
    assert_one_line_error(luigi_cli("--hellaswag", str(path), run_root=tmp_path), "not a multiple of 6")
