"""HellaSwag as llama-perplexity scores it (`--hellaswag FILE`, `--hellaswag-tasks N`).

The file is llama.cpp's: 6 lines a task, the context ("activity label: context"), the index
of the gold ending, then the 4 endings. Tasks are taken in llama-perplexity's random order
(task_order.py). Each ending is one sequence, `context + " " + ending` tokenized with the
model's BOS rule; the tokens all four share are not scored, and an ending's score is the mean
log-probability of its remaining tokens; the first maximum is the choice (acc_norm).
"""
import math

import numpy as np

from ...errors import UserError
from .choice import Choice, ChoiceMode, ChoiceTask, common_prefix
from .task_order import llama_task_order

LINES_PER_TASK = 6
ENDINGS = 4
Z_95 = 1.95996398454      # the normal quantile of llama-perplexity's 95% interval


def read_tasks(text: str, source: str) -> list[tuple[str, int, list[str]]]:
    """(context, gold ending, endings) of each task of a llama.cpp HellaSwag file, in its text as
    llama-perplexity reads -f (its final newline dropped: a file that ends in a blank line ends
    in a newline here)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()                                  # std::getline gives no line after the last newline
    if not lines or len(lines) % LINES_PER_TASK:
        raise UserError(f"{source}: {len(lines)} lines, not a multiple of {LINES_PER_TASK}; a HellaSwag file "
                        f"(llama.cpp's layout) has a context, the gold ending's index and 4 endings per task")
    tasks = []
    for t in range(len(lines) // LINES_PER_TASK):
        context, gold, *endings = lines[t * LINES_PER_TASK:(t + 1) * LINES_PER_TASK]
        if not gold.strip().isdigit() or int(gold) >= ENDINGS:
            raise UserError(f"{source}: line {t * LINES_PER_TASK + 2} should be the gold ending's index "
                            f"(0 to {ENDINGS - 1}), not {gold!r}")
        tasks.append((context, int(gold), endings))
    return tasks


class HellaSwag(ChoiceMode):
    name = "hellaswag"
    read = staticmethod(read_tasks)
    order = staticmethod(llama_task_order)

    def tokenize(self, index: int, task, encode) -> ChoiceTask:
        context, gold, endings = task
        seqs = [encode(f"{context} {ending}") for ending in endings]
        shared = common_prefix(seqs)
        # targets from the first token the endings do not share; at least the last one
        return ChoiceTask(index, gold, tuple(Choice(tuple(s), max(1, min(shared, len(s) - 1)), len(s)) for s in seqs))

    def score_tasks(self, tasks: list[dict], means: list[list[float]]) -> dict:
        per_task, right = [], 0
        for t, (task, logprobs) in enumerate(zip(tasks, means, strict=True), start=1):
            choice = int(np.argmax(logprobs))          # the first maximum
            right += choice == task["gold"]
            low, high = wilson_interval(right, t)
            per_task.append({**task, "choice": choice, "logprobs": logprobs,
                             "accuracy": 100 * right / t, "ci95": [100 * low, 100 * high]})
        return {"accuracy": per_task[-1]["accuracy"], "ci95": per_task[-1]["ci95"], "per_task": per_task}

    def report_rows(self, r: dict) -> list[tuple[str, str]]:
        h = r["hellaswag"]
        return [("HellaSwag acc_norm", f"{h['accuracy']:.4f}% [{h['ci95'][0]:.4f}%, {h['ci95'][1]:.4f}%]"),
                ("Tasks", f"{h['tasks']} of {h['available']}"),
                *self.scale_rows(r)]

    def print_details(self, r: dict, per_sequence: bool) -> None:
        print("\ntask\tacc_norm\t95% confidence interval")
        for i, t in enumerate(r["hellaswag"]["per_task"], start=1):
            print(f"{i}\t{t['accuracy']:3.8f}%\t[{t['ci95'][0]:3.4f}%, {t['ci95'][1]:3.4f}%]")


def wilson_interval(right: int, n: int) -> tuple[float, float]:
    """The 95% Wilson score interval of right/n, as llama-perplexity computes it."""
    freq, z = right / n, Z_95 * Z_95 / n
    spread = z * math.sqrt(n * (4.0 * freq * (1 - freq) + z)) / (Z_95 + Z_95)
    return (freq + z * 0.5 - spread) / (1.0 + z), (freq + z * 0.5 + spread) / (1.0 + z)
