"""Multiple choice as llama-perplexity scores it (`--multiple-choice FILE`,
`--multiple-choice-tasks N`): llama.cpp's binary task file (ARC, MMLU, TruthfulQA as its users
pass them; its layout: run/multiple_choice_file.py), scored as HellaSwag is, with any number of
answers. Each answer is one sequence, `question + " " + answer` with the model's BOS rule; the
tokens all answers share are not scored; an answer's score is the mean log-probability of the
rest; the first maximum is the choice, right where its label is 1 (any number of answers may be,
none too: that task is counted and never right, as llama-perplexity counts it).
"""
import numpy as np

from ..multiple_choice_file import read_tasks
from .choice import Choice, ChoiceMode, ChoiceTask, common_prefix
from .task_order import llama_sampled_order


class MultipleChoice(ChoiceMode):
    name = "multiple-choice"
    binary = True
    read = staticmethod(read_tasks)
    order = staticmethod(llama_sampled_order)

    def tokenize(self, index: int, task, encode) -> ChoiceTask:
        question, answers, labels = task
        seqs = [encode(f"{question} {answer}") for answer in answers]
        shared = common_prefix(seqs)
        return ChoiceTask(index, tuple(a for a, label in enumerate(labels) if label == 1),
                          tuple(Choice(tuple(s), max(1, min(shared, len(s) - 1)), len(s)) for s in seqs))

    def score_tasks(self, tasks: list[dict], means: list[list[float]]) -> dict:
        per_task, right = [], 0
        for t, (task, logprobs) in enumerate(zip(tasks, means, strict=True), start=1):
            choice = int(np.argmax(logprobs))        # the first maximum
            right += choice in task["gold"]
            per_task.append({**task, "choice": choice, "logprobs": logprobs, "accuracy": 100 * right / t})
        # llama-perplexity's final lines, in its float32 arithmetic
        n, answers = np.float32(len(tasks)), sum(len(m) for m in means)
        p, chance = np.float32(right) / n, n / np.float32(answers)
        spread = lambda q: float(np.float32(100) * np.sqrt(q * (np.float32(1) - q) / max(n - 1, 1)))  # noqa: E731
        return {"accuracy": float(np.float32(100) * p), "error": spread(p), "chance": float(np.float32(100) * chance),
                "chance_error": spread(chance), "per_task": per_task}

    def report_rows(self, r: dict) -> list[tuple[str, str]]:
        m = r["multiple-choice"]
        return [("Multiple choice", f"{m['accuracy']:.4f} +/- {m['error']:.4f}"),
                ("Random chance", f"{m['chance']:.4f} +/- {m['chance_error']:.4f}"),
                ("Tasks", f"{m['tasks']} of {m['available']}"),
                *self.scale_rows(r)]

    def print_details(self, r: dict, per_sequence: bool) -> None:
        m = r["multiple-choice"]
        print("\ntask\tacc_norm")
        for i, t in enumerate(m["per_task"], start=1):
            print(f"{i}\t{t['accuracy']:.8f}")
        if m["tasks"] >= 100 or m["tasks"] == m["available"]:   # as llama-perplexity prints them
            print(f"\nFinal result: {m['accuracy']:.4f} +/- {m['error']:.4f}")
            print(f"Random chance: {m['chance']:.4f} +/- {m['chance_error']:.4f}")
