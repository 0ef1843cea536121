"""Multiple choice as llama-perplexity scores it (`--multiple-choice FILE`,
`--multiple-choice-tasks N`): llama.cpp's binary task file (ARC, MMLU, TruthfulQA as its users
pass them), scored as HellaSwag is, with any number of answers.

The file: uint32 task count, a uint32 offset of each task, then each task: the question, the
single-answer set (uint32 count, the answers, an int32 label each, 1 for right) and a
multiple-answer set in the same layout (not scored, as llama-perplexity scores none). Strings
are a uint32 length and that many UTF-8 bytes. Each answer is one sequence, `question + " " +
answer` with the model's BOS rule; the tokens all answers share are not scored; an answer's score
is the mean log-probability of the rest; the first maximum is the choice.
"""
import struct

import numpy as np

from ...errors import UserError
from .choice import Choice, ChoiceMode, ChoiceTask, common_prefix
from .task_order import llama_sampled_order

MAX_ANSWERS = 100          # llama-perplexity refuses a set with more


def read_tasks(data: bytes, source: str) -> list[tuple[str, list[str], list[int]]]:
    """(question, answers, labels) of each task of llama.cpp's binary multiple-choice file."""
    def fail(what: str):
        raise UserError(f"{source}: {what}; a multiple-choice file is llama.cpp's binary layout "
                        f"(pass it as llama-perplexity's -bf file)")

    def u32(at: int) -> tuple[int, int]:
        if at + 4 > len(data):
            fail(f"ends at byte {len(data)}, inside a task")
        return struct.unpack_from("<I", data, at)[0], at + 4

    def string(at: int) -> tuple[str, int]:
        size, at = u32(at)
        if at + size > len(data):
            fail(f"a string of {size} bytes at byte {at} runs past the end")
        try:
            return data[at:at + size].decode("utf-8"), at + size
        except UnicodeDecodeError:
            fail(f"the string at byte {at} is not UTF-8")

    def answers(at: int) -> tuple[list[str], list[int], int]:
        n, at = u32(at)
        if n > MAX_ANSWERS:
            fail(f"a task with {n} answers (at most {MAX_ANSWERS})")
        texts = []
        for _ in range(n):
            text, at = string(at)
            texts.append(text)
        if at + 4 * n > len(data):
            fail("a task's labels run past the end")
        return texts, list(struct.unpack_from(f"<{n}i", data, at)), at + 4 * n

    n_task, at = u32(0)
    if n_task == 0:
        fail("no tasks")
    if 4 + 4 * n_task > len(data):
        fail(f"{n_task} task offsets do not fit in {len(data)} bytes")
    tasks = []
    for t, pos in enumerate(struct.unpack_from(f"<{n_task}I", data, 4)):
        question, at = string(pos)
        texts, labels, at = answers(at)
        answers(at)                                   # the multiple-answer set: read, not scored
        if not question or not texts or not all(texts) or 1 not in labels:
            fail(f"task {t} has an empty question or answer, or no right answer")
        tasks.append((question, texts, labels))
    return tasks


class MultipleChoice(ChoiceMode):
    name = "multiple-choice"
    binary = True
    read = staticmethod(read_tasks)
    order = staticmethod(llama_sampled_order)

    def tokenize(self, index: int, task, encode) -> ChoiceTask:
        question, answers, labels = task
        seqs = [encode(f"{question} {answer}") for answer in answers]
        shared = common_prefix(seqs)
        return ChoiceTask(index, labels.index(1),
                          tuple(Choice(tuple(s), max(1, min(shared, len(s) - 1)), len(s)) for s in seqs))

    def score_tasks(self, tasks: list[dict], means: list[list[float]]) -> dict:
        per_task, right = [], 0
        for t, (task, logprobs) in enumerate(zip(tasks, means, strict=True), start=1):
            choice = int(np.argmax(logprobs))        # the first maximum
            right += choice == task["gold"]
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
                ("Tokens scored", f"{r['tokens_scored']:,}"),
                ("Context", str(r["ctx"]))]

    def print_details(self, r: dict, per_sequence: bool) -> None:
        m = r["multiple-choice"]
        print("\ntask\tacc_norm")
        for i, t in enumerate(m["per_task"], start=1):
            print(f"{i}\t{t['accuracy']:.8f}")
        if m["tasks"] >= 100 or m["tasks"] == m["available"]:   # as llama-perplexity prints them
            print(f"\nFinal result: {m['accuracy']:.4f} +/- {m['error']:.4f}")
            print(f"Random chance: {m['chance']:.4f} +/- {m['chance_error']:.4f}")


def write_tasks(tasks: list[tuple[str, list[str], list[int]]]) -> bytes:
    """llama.cpp's binary multiple-choice file of (question, answers, labels) tasks, with an empty
    multiple-answer set each."""
    def string(text: str) -> bytes:
        raw = text.encode("utf-8")
        return struct.pack("<I", len(raw)) + raw

    bodies = [string(q) + struct.pack("<I", len(a)) + b"".join(map(string, a)) + struct.pack(f"<{len(a)}i", *labels)
              + struct.pack("<I", 0) for q, a, labels in tasks]
    offsets, at = [], 4 + 4 * len(tasks)
    for body in bodies:
        offsets.append(at)
        at += len(body)
    return struct.pack(f"<I{len(tasks)}I", len(tasks), *offsets) + b"".join(bodies)
