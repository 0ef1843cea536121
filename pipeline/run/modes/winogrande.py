"""Winogrande as llama-perplexity scores it (`--winogrande FILE`, `--winogrande-tasks N`).

The file is llama.cpp's CSV, `index,sentence,option1,option2,answer` a line (the sentence
quoted where it holds a comma, `_` where an option goes, the answer 1 or 2). Each option is
one sequence, `first + option + second` tokenized with the model's BOS rule. Where both
sequences go on for more than 3 tokens past what they share, only the continuation after the
option is scored (from `first + option`'s length); otherwise everything after the shared
tokens; the last token is never scored where more than one is. The choice is 1 when its mean
log-probability is strictly higher, else 2.

llama-perplexity reads the second option's first scored log-probability from the wrong logits
where the option itself is scored (its own FIXME): those of the first sequence's last token.
Exact numerics compute the one the model gives there; llama-cpp numerics read it as
llama-perplexity does, from the token placed after the first sequence (Choice.after). The
result says how many tasks that is and which way they were scored.
"""
import numpy as np

from ...errors import UserError
from .choice import Choice, ChoiceMode, ChoiceTask, common_prefix
from .task_order import llama_sampled_order

MIN_TRAILING = 3          # llama-perplexity's k_min_trailing_ctx


def read_tasks(text: str, source: str) -> list[tuple[str, str, tuple[str, str], int]]:
    """(first, second, options, answer 1 or 2) of each line llama-perplexity accepts in the file's
    text as it reads -f (its final newline dropped); it skips a line it cannot read (a header,
    say), and the last line: its CSV reader drops a last line without a newline."""
    tasks = []
    for line in text.split("\n")[:-1]:
        commas, quoted = [], False
        for i, ch in enumerate(line):
            if ch == '"':
                quoted = not quoted
            elif ch == "," and not quoted:
                commas.append(i)
                if len(commas) == 4:
                    break
        if len(commas) != 4:
            continue
        a, b, c, d = commas
        sentence = line[a + 2:b - 1] if line[a + 1:a + 2] == '"' else line[a + 1:b]
        answer = line[d + 1:].strip()
        if "_" not in sentence or answer not in ("1", "2"):
            continue
        where = sentence.index("_")
        tasks.append((sentence[:where], sentence[where + 1:], (line[b + 1:c], line[c + 1:d]), int(answer)))
    if not tasks:
        raise UserError(f"{source}: no Winogrande task in llama.cpp's CSV layout "
                        f"(index,sentence,option1,option2,answer a line, `_` in the sentence)")
    return tasks


class Winogrande(ChoiceMode):
    name = "winogrande"
    read = staticmethod(read_tasks)
    order = staticmethod(llama_sampled_order)

    def tokenize(self, index: int, task, encode) -> ChoiceTask:
        first, second, options, answer = task
        seqs = [encode(first + option + second) for option in options]
        shared = common_prefix(seqs)
        skip_option = all(len(s) - shared > MIN_TRAILING for s in seqs)
        choices = []
        for s, option in zip(seqs, options, strict=True):
            base = len(encode(first + option)) if skip_option else shared
            last = 1 if len(s) - base > 1 else 0
            choices.append(Choice(tuple(s), max(1, base), len(s) - last))
        if skip_option or not 1 <= shared < len(seqs[1]) or choices[1].lo == choices[1].hi:
            return ChoiceTask(index, answer - 1, tuple(choices))
        # the second option's first target, as llama-perplexity reads it: after the first sequence
        misread = Choice(choices[0].tokens, choices[0].lo, choices[0].hi, after=seqs[1][shared])
        return ChoiceTask(index, answer - 1, (misread, choices[1]), misread=1)

    def reduce(self, scored: list[np.ndarray], attrs: dict) -> dict:
        result = super().reduce(scored, attrs)
        misread = sum(t["misread"] is not None for t in attrs[self.name]["tasks"])
        result[self.name]["misread"] = {"tasks": misread, "scored_as": "llama-perplexity" if
                                        self.numerics == "llama-cpp" else "correct"}
        return result

    def score_tasks(self, tasks: list[dict], means: list[list[float]]) -> dict:
        per_task, right = [], 0
        for t, (task, (first, second)) in enumerate(zip(tasks, means, strict=True), start=1):
            choice = 0 if first > second else 1      # a NaN score (nothing scored) picks option 2, as there
            right += choice == task["gold"]
            per_task.append({**task, "choice": choice, "logprobs": [first, second], "accuracy": 100 * right / t})
        # llama-perplexity's final score, in its float32 arithmetic
        n, p = len(tasks), np.float32(right) / np.float32(len(tasks))
        error = np.float32(100) * np.sqrt(p * (np.float32(1) - p) / np.float32(max(n - 1, 1)))
        return {"accuracy": float(np.float32(100) * p), "error": float(error), "per_task": per_task}

    def report_rows(self, r: dict) -> list[tuple[str, str]]:
        w = r["winogrande"]
        return [("Winogrande", f"{w['accuracy']:.4f} +/- {w['error']:.4f}"),
                ("Tasks", f"{w['tasks']} of {w['available']}"),
                *self.scale_rows(r),
                ("Option 2 misread", misread_text(w["misread"]))]

    def print_details(self, r: dict, per_sequence: bool) -> None:
        print()
        for i, t in enumerate(r["winogrande"]["per_task"], start=1):
            print(f"{i}\t{t['accuracy']:.4f}\t{t['logprobs'][0]:10.6f}  {t['logprobs'][1]:10.6f}  "
                  f"{t['choice'] + 1}  {t['gold'] + 1}")
        w = r["winogrande"]
        if w["tasks"] >= 100:   # llama-perplexity prints no final score over fewer tasks
            print(f"\nFinal Winogrande score({w['tasks']} tasks): {w['accuracy']:.4f} +/- {w['error']:.4f}")


def misread_text(misread: dict) -> str:
    if misread["scored_as"] == "llama-perplexity":
        return f"{misread['tasks']} tasks scored as llama-perplexity reads them (--numerics llama-cpp)"
    return f"{misread['tasks']} tasks scored as the model gives them, not as llama-perplexity reads them"
