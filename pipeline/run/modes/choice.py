"""What the choice tasks share (HellaSwag, Winogrande, multiple choice): a task file read into
tasks, taken in llama-perplexity's order, each choice of a task tokenized into one sequence with
the range of its targets that is scored; the rows the trunk runs, packed as llama-perplexity
batches a task (the tokens its sequences share once, each sequence's own after them as a branch,
several tasks a row: packed_rows) where the model's family packs rows, else a row per sequence
padded after its last token (attention is causal: padding moves no score, and a window computes
a chunk only up to its last scored position); a choice's score is the mean log-probability of
its scored targets, and the mode decides and prints as llama-perplexity does."""
import bisect
import functools
import math
from dataclasses import dataclass

import numpy as np

from ...errors import UserError
from ..corpus_plan import LAYOUT_FIELDS, SequencePlan
from .base import Mode, ModePlan


@dataclass(frozen=True)
class Choice:
    tokens: tuple[int, ...]
    lo: int       # the first scored target position (>= 1: a target is predicted from the one before)
    hi: int       # one past the last
    # a token placed after the sequence, its target scored from the last token's logits: where
    # llama-perplexity reads the next choice's first target (Winogrande's FIXME); None: nothing after
    after: int | None = None

    @property
    def width(self) -> int:
        """Positions the sequence takes in its row."""
        return len(self.tokens) + (self.after is not None)

    @property
    def scored_end(self) -> int:
        """One past the last target its row scores: its own, and the one after it, if any."""
        return self.width if self.after is not None else self.hi


@dataclass(frozen=True)
class ChoiceTask:
    index: int                     # in the file
    gold: int | tuple[int, ...]    # the right choice, from 0 (multiple choice: the right ones)
    choices: tuple[Choice, ...]
    # the choice whose first target llama-perplexity reads from the one before's `after` position
    # (llama-cpp numerics score it so; exact numerics from its own sequence); None: none
    misread: int | None = None


PACKED_ROW = 512      # positions of a packed row where --ctx is not given (at least the widest task's)


class ChoiceMode(Mode):
    binary = False        # a task file of bytes (multiple choice), else of UTF-8 text
    # 2: rows may hold a target after their choice; attrs give each choice's scored count; 3: attrs give
    # the positions computed and llama-perplexity's
    plan_version = 3

    def content(self, task, corpus: str, escape: bool = False) -> tuple:
        """(the task file's bytes, or its text as llama-perplexity reads -f, and its label)."""
        from ..evaltask import corpus_bytes, corpus_text, llama_prompt

        if self.binary:
            return corpus_bytes(task, corpus)
        text, label = corpus_text(task, corpus)
        return llama_prompt(text, escape), label

    # read(content, source) -> the file's tasks, as the mode's own records
    # order(n_available, n_take) -> the file indices of the tasks llama-perplexity scores, in its order
    read = order = None

    @classmethod
    def packs(cls, spec) -> bool:
        return packs(spec.gguf)

    def tokenize(self, index: int, task, encode) -> ChoiceTask:
        """One task's choices as sequences; encode(text) -> ids with the model's BOS rule."""
        raise NotImplementedError

    def score_tasks(self, tasks: list[dict], means: list[list[float]]) -> dict:
        """Each task ({"index", "gold"}) and its choices' mean log-probabilities -> the mode's result."""
        raise NotImplementedError

    def plan(self, spec) -> ModePlan:
        text, source = self.content(spec.eval_task, spec.corpus, spec.escape)
        available, tasks = tokenized(type(self), str(spec.model_path), text, source, spec.method.chunks,
                                     spec.method.bos)
        ctx, choices = spec.method.ctx, [c for t in tasks for c in t.choices]
        longest = max(c.width for c in choices)
        if longest > ctx:
            raise UserError(f"a {self.name} choice is {longest} tokens long, beyond --ctx {ctx}: raise --ctx "
                            f"(or leave it unset: the longest task sets it)")
        attrs = {self.name: {"tasks": [{"index": t.index, "gold": t.gold, "scored": [c.hi - c.lo for c in t.choices],
                                        "misread": t.misread} for t in tasks],
                             "available": available, "llama_positions": sum(map(llama_positions, tasks))}}
        tokens = np.concatenate([np.asarray(c.tokens, np.int32) for c in choices])
        return ModePlan(tokens, packed_rows(tasks, ctx) if self.packs(spec) else choice_rows(choices, ctx), attrs)

    def reduce(self, scored: list[np.ndarray], attrs: dict) -> dict:
        tasks, means, row, n_scored = attrs[self.name]["tasks"], [], 0, 0
        for task in tasks:
            rows = scored[row:row + len(task["scored"])]
            nll = [r[:n, 0] for r, n in zip(rows, task["scored"], strict=True)]
            if (c := task["misread"]) is not None and self.numerics == "llama-cpp":
                nll[c] = np.concatenate([rows[c - 1][-1:, 0], nll[c][1:]])   # the `after` target, as there
            # a choice with nothing scored has NaN, as llama-perplexity's 0 / 0
            means.append([float(-x.mean()) if len(x) else math.nan for x in nll])
            n_scored += sum(map(len, nll))
            row += len(rows)
        result = self.score_tasks([{"index": t["index"], "gold": t["gold"]} for t in tasks], means)
        return {self.name: {"tasks": len(tasks), "available": attrs[self.name]["available"], **result},
                "tokens_scored": n_scored, "positions": {"computed": attrs["positions_computed"],
                                                         "llama_perplexity": attrs[self.name]["llama_positions"]}}

    def scale_rows(self, r: dict) -> list[tuple[str, str]]:
        """The report's rows of what the run computed: tokens scored, positions, context."""
        p = r["positions"]
        return [("Tokens scored", f"{r['tokens_scored']:,}"),
                ("Positions computed", f"{p['computed']:,} (llama-perplexity's {p['llama_perplexity']:,}: "
                                       f"each task's shared tokens once)"),
                ("Context", str(r["ctx"]))]


def common_prefix(seqs: list[list[int]]) -> int:
    """Tokens all sequences share from the start."""
    shared = 0
    while shared < min(map(len, seqs)) and len({s[shared] for s in seqs}) == 1:
        shared += 1
    return shared


def llama_positions(task: ChoiceTask) -> int:
    """The positions llama-perplexity computes for a task: the tokens its sequences share, once,
    and each sequence's own after them."""
    shared = common_prefix([list(c.tokens) for c in task.choices])
    return shared + sum(len(c.tokens) - shared for c in task.choices)


def packs(gguf) -> bool:
    """Whether the model's family computes packed rows (SequencePlan.layout); an architecture not
    computed at all is refused where the model is loaded."""
    from ...model.arch import ARCHITECTURES

    family = ARCHITECTURES.get(gguf.architecture)
    return family is not None and family.packs_sequences


def choice_rows(choices: list[Choice], ctx: int) -> SequencePlan:
    """A row per choice: its sequence from position 0, padded after its last token (and the
    target after it, if any)."""
    ids = np.zeros((len(choices), ctx), dtype=np.int32)
    for r, c in enumerate(choices):
        ids[r, :len(c.tokens)] = c.tokens
        ids[r, len(c.tokens):] = c.tokens[-1]           # padding: after every scored target
        if c.after is not None:
            ids[r, len(c.tokens)] = c.after
    # a row's scored range covers its choice's targets and the target after it, if any
    hi = [c.scored_end for c in choices]
    return SequencePlan(ids, np.array([c.lo for c in choices], np.int32), np.array(hi, np.int32), len(choices))


def shared_length(task: ChoiceTask) -> int:
    """The tokens a task's sequences share that none of them scores: computed once when packed."""
    return min(common_prefix([list(c.tokens) for c in task.choices]), min(c.lo for c in task.choices))


def packed_width(shared: int, choices: tuple[Choice, ...]) -> int:
    """Positions choices packed take: their shared tokens once and each one's own after them."""
    return shared + sum(c.width - shared for c in choices)


def task_width(task: ChoiceTask) -> int:
    """Positions a whole task packed takes."""
    return packed_width(shared_length(task), task.choices)


def task_parts(task: ChoiceTask, ctx: int) -> list[tuple[int, tuple[Choice, ...]]]:
    """(shared tokens, choices) of each part of a task packed in rows of ctx: the whole task where
    it fits, else its choices in order, as many a part as fit beside the shared tokens."""
    shared = shared_length(task)
    parts, part, fill = [], [], shared
    for c in task.choices:
        if part and fill + c.width - shared > ctx:
            parts.append((shared, tuple(part)))
            part, fill = [], shared
        part.append(c)
        fill += c.width - shared
    return [*parts, (shared, tuple(part))]


def packed_rows(tasks: tuple[ChoiceTask, ...], ctx: int) -> SequencePlan:
    """Tasks packed into rows of ctx positions: each task (or part of one, task_parts) its shared
    tokens (branch 0) then each choice's own (branch k + 1, positions continuing from the shared
    ones'); a span per choice, in the tasks' order, its first target predicted from the shared
    tokens' last where it starts there. The parts go widest first each into the row it fills
    most (best fit), so that rows are full and a chunk computes little padding; a row holds its
    parts in the tasks' order, and the rest of it is padding, a sequence of its own that no span
    reads."""
    units = [part for task in tasks for part in task_parts(task, ctx)]           # (shared, choices)
    widths = [packed_width(*unit) for unit in units]
    room, members = [], []          # room: (free positions, row) of the rows so far, sorted; members: their units
    for u in sorted(range(len(units)), key=lambda u: -widths[u]):
        k = bisect.bisect_left(room, (widths[u], -1))                  # the fullest row it fits in
        if k < len(room):
            free, r = room.pop(k)
        else:
            free, r = ctx, len(members)
            members.append([])
        members[r].append(u)
        bisect.insort(room, (free - widths[u], r))
    members = sorted(sorted(m) for m in members)                  # rows in the order of their first task
    where = {u: (r, seq) for r, m in enumerate(members) for seq, u in enumerate(m)}
    starts = {u: sum(widths[v] for v in m[:seq]) for m in members for seq, u in enumerate(m)}
    ids = np.zeros((len(members), ctx), dtype=np.int32)
    layout = np.zeros((len(members), ctx, len(LAYOUT_FIELDS)), dtype=np.int32)   # LAYOUT_FIELDS
    lo, hi, first_from, span_rows = [], [], [], []
    for u, (shared, choices) in enumerate(units):
        (r, seq), at = where[u], starts[u]
        ids[r, at:at + shared] = choices[0].tokens[:shared]
        layout[r, at:at + shared] = np.stack([np.arange(shared), np.full(shared, seq), np.zeros(shared)], -1)
        base, at = at, at + shared
        for b, c in enumerate(choices, start=1):
            own = [*c.tokens[shared:], *([] if c.after is None else [c.after])]
            ids[r, at:at + len(own)] = own
            layout[r, at:at + len(own)] = np.stack([shared + np.arange(len(own)), np.full(len(own), seq),
                                                    np.full(len(own), b)], -1)
            # position p of the choice's sequence lies at base + p (shared) or at + p - shared (its own)
            lo.append(at + c.lo - shared)
            hi.append(at + c.scored_end - shared)
            first_from.append(base + c.lo - 1 if c.lo - 1 < shared else at + c.lo - 1 - shared)
            span_rows.append(r)
            at += len(own)
    for r, m in enumerate(members):
        end = sum(widths[u] for u in m)
        ids[r, end:] = ids[r, end - 1]
        layout[r, end:] = np.stack([np.arange(ctx - end), np.full(ctx - end, len(m)), np.zeros(ctx - end)], -1)
    as_int = functools.partial(np.array, dtype=np.int32)
    return SequencePlan(ids, as_int(lo), as_int(hi), len(members), as_int(span_rows), as_int(first_from), layout)


@functools.lru_cache(maxsize=4)
def tokenized(mode: type["ChoiceMode"], model_path: str, text, source: str, n_tasks: int, add_bos: bool) -> tuple:
    """(the tasks in the file, the tasks a run scores (n_tasks of them, 0: all) tokenized by the
    choice mode `mode`: ChoiceTask each, in order)."""
    from ...gguf_io.reader import open_gguf
    from ...gguf_io.tokenizer import load_tokenizer

    choice_mode = mode()
    records = choice_mode.read(text, source)
    tokenizer = load_tokenizer(open_gguf(model_path))
    encode = functools.partial(tokenizer.encode, add_bos=add_bos)
    return len(records), tuple(choice_mode.tokenize(i, records[i], encode)
                               for i in choice_mode.order(len(records), n_tasks))


def row_width(mode: type["ChoiceMode"], model_path: str, text, source: str, n_tasks: int, add_bos: bool,
              context: int) -> int:
    """The ctx a run sets when --ctx is not given: where the model's family packs rows, PACKED_ROW
    positions (the model's context, if shorter), or the longest task's if wider, so that rows hold
    several tasks and a chunk computes little padding; else the longest choice's sequence."""
    from ...gguf_io.reader import open_gguf

    _, tasks = tokenized(mode, model_path, text, source, n_tasks, add_bos)
    if not packs(open_gguf(model_path)):
        return max(c.width for t in tasks for c in t.choices)
    return max(max(map(task_width, tasks)), min(PACKED_ROW, context))
