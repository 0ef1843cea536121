"""HellaSwag as llama-perplexity scores it (`--hellaswag FILE`, `--hellaswag-tasks N`).

The file is llama.cpp's: 6 lines a task, the context ("activity label: context"), the index
of the gold ending, then the 4 endings. Tasks are taken in llama-perplexity's random order
(task_order.py). Each ending is one sequence, `context + " " + ending` tokenized with the
model's BOS rule; the tokens all four share are not scored, and an ending's score is the mean
log-probability of its remaining tokens; the first maximum is the choice (acc_norm). Sequences
are padded to the run's ctx after their last token: attention is causal, so padding changes no
scored position.
"""
import functools
import math

import numpy as np

from ...errors import UserError
from ..corpus_plan import SequencePlan
from .base import Mode, ModePlan
from .task_order import llama_task_order

LINES_PER_TASK = 6
ENDINGS = 4
Z_95 = 1.95996398454      # the normal quantile of llama-perplexity's 95% interval


def read_tasks(text: str, source: str) -> list[tuple[str, int, list[str]]]:
    """(context, gold ending, endings) of each task of a llama.cpp HellaSwag file."""
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


@functools.lru_cache(maxsize=4)
def tokenized(model_path: str, text: str, source: str, n_tasks: int, add_bos: bool) -> tuple:
    """The selected tasks, each (file index, gold, its 4 endings' token ids, shared prefix)."""
    from ...gguf_io.reader import open_gguf
    from ...gguf_io.tokenizer import load_tokenizer

    tasks = read_tasks(text, source)
    tokenizer = load_tokenizer(open_gguf(model_path))
    chosen = []
    for index in llama_task_order(len(tasks), n_tasks or len(tasks)):
        context, gold, endings = tasks[index]
        seqs = [tokenizer.encode(f"{context} {ending}", add_bos=add_bos) for ending in endings]
        shared = 0
        while shared < min(map(len, seqs)) and len({s[shared] for s in seqs}) == 1:
            shared += 1
        chosen.append((index, gold, seqs, shared))
    return tuple(chosen)


def longest_sequence(model_path: str, text: str, source: str, n_tasks: int, add_bos: bool) -> int:
    """The tokens of the longest ending's sequence: the ctx a run sets when --ctx is not given."""
    return max(len(s) for *_, seqs, _ in tokenized(model_path, text, source, n_tasks, add_bos) for s in seqs)


class HellaSwag(Mode):
    name = "hellaswag"

    def plan(self, spec) -> ModePlan:
        from ..evaltask import corpus_text

        text, source = corpus_text(spec.eval_task, spec.corpus)
        tasks = tokenized(str(spec.model_path), text, source, spec.method.chunks, spec.method.bos)
        ctx, rows = spec.method.ctx, [seq for *_, seqs, _ in tasks for seq in seqs]
        longest = max(map(len, rows))
        if longest > ctx:
            raise UserError(f"a HellaSwag ending is {longest} tokens long, beyond --ctx {ctx}: raise --ctx "
                            f"(or leave it unset: the longest sequence sets it)")
        ids = np.zeros((len(rows), ctx), dtype=np.int32)
        for r, seq in enumerate(rows):
            ids[r, :len(seq)] = seq
            ids[r, len(seq):] = seq[-1]                 # padding: after every scored target
        # targets from the first token the endings do not share; at least the last one, at
        # least position 1 (a target is predicted from the position before it)
        lo = np.array([max(1, min(shared, len(seq) - 1)) for *_, seqs, shared in tasks for seq in seqs], np.int32)
        hi = np.array([len(seq) for seq in rows], np.int32)
        attrs = {"hellaswag": {"tasks": [{"index": index, "gold": gold} for index, gold, *_ in tasks],
                               "available": len(read_tasks(text, source))}}
        return ModePlan(np.concatenate([np.asarray(s, np.int32) for s in rows]),
                        SequencePlan(ids, lo, hi, len(rows)), attrs)

    def reduce(self, scored: list[np.ndarray], attrs: dict) -> dict:
        tasks, per_task, right = attrs["hellaswag"]["tasks"], [], 0
        for t, task in enumerate(tasks):
            logprobs = [float(-rows[:, 0].mean()) for rows in scored[t * ENDINGS:(t + 1) * ENDINGS]]
            choice = int(np.argmax(logprobs))        # the first maximum
            right += choice == task["gold"]
            low, high = wilson_interval(right, t + 1)
            per_task.append({**task, "choice": choice, "logprobs": logprobs,
                             "acc_norm": 100 * right / (t + 1), "ci95": [100 * low, 100 * high]})
        n = len(tasks)
        return {"hellaswag": {"tasks": n, "available": attrs["hellaswag"]["available"],
                              "acc_norm": 100 * right / n, "ci95": per_task[-1]["ci95"], "per_task": per_task},
                "tokens_scored": int(sum(rows.shape[0] for rows in scored))}

    def report_rows(self, r: dict) -> list[tuple[str, str]]:
        h = r["hellaswag"]
        return [("HellaSwag acc_norm", f"{h['acc_norm']:.4f}% [{h['ci95'][0]:.4f}%, {h['ci95'][1]:.4f}%]"),
                ("Tasks", f"{h['tasks']} of {h['available']}"),
                ("Tokens scored", f"{r['tokens_scored']:,}"),
                ("Context", str(r["ctx"]))]

    def print_details(self, r: dict, per_sequence: bool) -> None:
        print("\ntask\tacc_norm\t95% confidence interval")
        for i, t in enumerate(r["hellaswag"]["per_task"], start=1):
            print(f"{i}\t{t['acc_norm']:3.8f}%\t[{t['ci95'][0]:3.4f}%, {t['ci95'][1]:3.4f}%]")


def wilson_interval(right: int, n: int) -> tuple[float, float]:
    """The 95% Wilson score interval of right/n, as llama-perplexity computes it."""
    freq, z = right / n, Z_95 * Z_95 / n
    spread = z * math.sqrt(n * (4.0 * freq * (1 - freq) + z)) / (Z_95 + Z_95)
    return (freq + z * 0.5 - spread) / (1.0 + z), (freq + z * 0.5 + spread) / (1.0 + z)
