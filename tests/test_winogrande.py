"""Winogrande as llama-perplexity scores it: its task order, its CSV, its partial scoring, and its
per-task scores on a real model."""
import hashlib
import json
import re

import pytest

from pipeline.errors import UserError
from pipeline.run.modes.task_order import llama_sampled_order
from pipeline.run.modes.winogrande import read_tasks

from .helpers import assert_one_line_error, luigi_cli

# llama-perplexity -m SmolLM2-135M-Instruct as F32 (llama-quantize --allow-requantize ... F32: the
# registered Q4_1 file's weights, dequantized; llama.cpp's CPU products then run in float32, where
# on Q4_1 it rounds activations to 8 bits) -f FIRST_40_TASKS.csv --winogrande -c 2048 -fa off
# -ctk f32 -ctv f32: per task, the two options' scores and its choice (tests/data/llama-perplexity.md)
LLAMA_F32 = [
    (-5.352839, -4.893104, 2),
    (-5.375301, -4.859817, 2),
    (-5.524755, -5.579916, 1),
    (-1.817232, -2.020070, 1),
    (-4.340443, -4.279480, 2),
    (-2.770687, -2.702264, 2),
    (-7.146801, -7.254070, 1),
    (-4.991686, -4.502161, 2),
    (-3.964023, -3.913694, 2),
    (-2.709035, -2.722633, 1),
    (-3.472435, -3.482826, 1),
    (-5.509081, -5.230645, 2),
    (-2.529668, -3.200186, 1),
    (-5.954333, -5.670180, 2),
    (-3.931500, -3.676495, 2),
    (-4.376923, -4.405879, 1),
    (-6.731913, -6.170000, 2),
    (-5.743795, -4.983663, 2),
    (-3.179013, -3.136876, 2),
    (-4.610930, -4.402385, 2),
    (-4.493991, -4.631143, 1),
    (-3.830771, -3.890658, 1),
    (-5.360785, -5.368513, 1),
    (-2.734148, -2.810733, 1),
    (-3.967916, -4.188504, 1),
    (-3.671502, -3.586852, 2),
    (-3.854444, -4.452430, 1),
    (-5.588030, -5.478926, 2),
    (-5.355023, -5.463708, 1),
    (-6.362371, -6.009799, 2),
    (-2.729880, -2.836142, 1),
    (-4.377980, -4.205274, 2),
    (-5.165623, -4.973146, 2),
    (-4.505119, -4.411562, 2),
    (-5.729286, -5.687887, 2),
    (-4.033955, -3.735848, 2),
    (-3.326401, -3.636207, 1),
    (-4.294873, -4.271392, 2),
    (-3.618577, -3.827918, 1),
]


def test_task_order_is_llama_perplexity_s():
    # printed by a C++ program drawing as llama-perplexity's winogrande_score does (g++ 12.2):
    # std::mt19937 rng(1); scale = 1/(1.f + (float)rng.max()); j = int(scale*rng()*aux.size())
    assert llama_sampled_order(1267, 10) == [528, 1262, 911, 1178, 0, 161, 381, 1258, 184, 296]
    printed = "".join(f"{i} " for i in llama_sampled_order(1267, 400)) + "\n"
    assert hashlib.sha256(printed.encode()).hexdigest() == \
        "c061037cde00b06bfbeb5e53822875fc5b4b6e80355ee83bb6481cc75ac49359"
    assert llama_sampled_order(5, 0) == llama_sampled_order(5, 9) == [0, 1, 2, 3, 4]   # all, in order


def test_csv_read_as_llama_perplexity_reads_it():
    from pipeline.run.evaltask import llama_prompt

    text = ('index,sentence,option1,option2,answer\n'                      # a header: skipped, as it does
            '0,"A, then _ left.",Tom,Ann,2\n'
            '1,No blank here.,Tom,Ann,1\n'                                 # no _: skipped
            '2,B saw _ go.,Tom,Ann,1\n'
            '3,C saw _ go.,Tom,Ann,1\n')          # the last line: dropped, as llama-perplexity reads -f files
    assert read_tasks(llama_prompt(text), "f.csv") == [("A, then ", " left.", ("Tom", "Ann"), 2),
                                                       ("B saw ", " go.", ("Tom", "Ann"), 1)]
    with pytest.raises(UserError, match="no Winogrande task"):
        read_tasks(llama_prompt("x,y\n"), "f.csv")


def test_scores_equal_llama_perplexity(tmp_path):
    from pipeline.run.eval_data import dataset_file

    head = tmp_path / "w40.csv"
    head.write_text("".join(dataset_file("winogrande").read_text().splitlines(keepends=True)[:40]))  # 39 scored
    done = luigi_cli("--winogrande", str(head), "--result-json", str(tmp_path / "r.json"), run_root=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = [line.split() for line in done.stdout.splitlines() if re.match(r"^\d+\t", line)]
    assert len(lines) == 39
    for (i, _, s1, s2, choice, _), (l1, l2, lc) in zip(lines, LLAMA_F32, strict=True):
        # llama.cpp sums each softmax in float32: its log-probabilities sit about 1.4e-4 above
        assert float(s1) == pytest.approx(l1, abs=5e-4) and float(s2) == pytest.approx(l2, abs=5e-4), i
        assert int(choice) == lc, i
    w = json.loads((tmp_path / "r.json").read_text())["winogrande"]
    assert w["tasks"] == 39 and w["accuracy"] == pytest.approx(100 * 19 / 39, rel=1e-6)
    assert "Final Winogrande score" not in done.stdout          # llama-perplexity prints none under 100 tasks


# 16 tasks of the validation set (its line numbers, from 0; the last line is not read), 9 of which
# have the option itself scored, where llama-perplexity reads the second option's first target
# from the first sequence's last logits (tasks 1, 3, 4, 6, 8, 9, 11, 13 and 15 here)
MISREAD_LINES = [129, 130, 146, 147, 148, 154, 155, 156, 162, 163, 174, 175, 180, 181, 197, 198, 199]
MISREAD = [1, 3, 4, 6, 8, 9, 11, 13, 15]
# llama-perplexity -m SmolLM2-135M-Instruct.Q4_1.gguf -f THOSE_LINES.csv --winogrande -t 2, its
# default command (Q8_1 activations, float16 cache, flash attention): each task's two scores and choice
LLAMA_DEFAULT = [
    (-1.966584, -12.164568, 1), (-4.510956, -4.574278, 1), (-4.997406, -11.520825, 1), (-5.277482, -12.221022, 1),
    (-2.867208, -2.811198, 2), (-3.871083, -7.077507, 1), (-3.365971, -3.191800, 2), (-3.151620, -14.779627, 1),
    (-1.801240, -18.280405, 1), (-4.106599, -3.841924, 2), (-1.342456, -14.337973, 1), (-4.630261, -4.222691, 2),
    (-5.472896, -11.073014, 1), (-2.654025, -2.437606, 2), (-5.343181, -6.567927, 1), (-4.883415, -4.819740, 2),
]


@pytest.mark.parametrize("numerics", ["llama-cpp", "exact"])
def test_llama_cpp_numerics_read_the_second_option_as_llama_perplexity(tmp_path, numerics):
    """Where the option itself is scored, llama-perplexity takes the second option's first
    log-probability from the logits after the first sequence (its FIXME). llama-cpp numerics read
    it there: those tasks' second scores lie within the 8-bit rounding's draw of llama-perplexity's
    (0.35 nats at most here; 0.22 over the 46 such tasks of the set, where a score of another task
    moves by up to 0.31) and their choices are its. Exact numerics score the option as the model
    gives it, 4.0 to 15.4 nats from llama-perplexity's."""
    from pipeline.run.eval_data import dataset_file

    lines = dataset_file("winogrande").read_text().splitlines(keepends=True)
    csv = tmp_path / "w.csv"
    csv.write_text("".join(lines[i] for i in MISREAD_LINES))
    done = luigi_cli("--winogrande", str(csv), "--numerics", numerics, run_root=tmp_path)
    assert done.returncode == 0, done.stderr
    scores = {int(line.split()[0]): line.split() for line in done.stdout.splitlines() if re.match(r"^\d+\t", line)}
    assert len(scores) == 16
    for t in MISREAD:
        _, _, _, second, choice, _ = scores[t]
        llama_second, llama_choice = LLAMA_DEFAULT[t - 1][1:]
        if numerics == "llama-cpp":
            assert abs(float(second) - llama_second) < 0.5 and int(choice) == llama_choice, t
        else:
            assert abs(float(second) - llama_second) > 3, t
    read_as = "as llama-perplexity reads them" if numerics == "llama-cpp" else "as the model gives them"
    assert re.search(rf"Option 2 misread +9 tasks scored {read_as}", done.stdout)


def test_a_choice_with_nothing_to_score_is_nan_and_picks_option_2(tmp_path):
    """Identical options leave no token to score: llama-perplexity's 0 / 0 gives NaN, and NaN >
    NaN is false, so it picks option 2; the other tasks score as ever."""
    from .helpers import run_pipeline

    csv = tmp_path / "w.csv"
    csv.write_text("0,Sarah was better than Maria so _ won.,Sarah,Maria,1\n1,Tom saw _ go.,Ann,Ann,1\n\n")
    w = run_pipeline(tmp_path / "runs", winogrande=str(csv))["winogrande"]
    assert w["tasks"] == 2
    first, same = w["per_task"]
    assert all(x == x for x in first["logprobs"]) and all(x != x for x in same["logprobs"])   # NaN only there
    assert same["choice"] == 1 and w["accuracy"] == pytest.approx(100 * (first["choice"] == 0) / 2)


@pytest.mark.parametrize("extra,match", [
    (["--hellaswag", "data/corpora/hellaswag-val.head48.txt"], "two runs"),
    (["--chunks", "3"], "--winogrande-tasks"),
])
def test_options_that_do_not_apply_are_refused(tmp_path, extra, match):
    csv = tmp_path / "w.csv"
    csv.write_text("0,Sarah was better than Maria so _ won.,Sarah,Maria,1\n")
    assert_one_line_error(luigi_cli("--winogrande", str(csv), *extra, run_root=tmp_path), match)
