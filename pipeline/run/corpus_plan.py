"""Sequence plan: the corpus cut into sequences of ctx tokens (what the model sees at once;
llama-perplexity's "chunks"), and which tokens of each are scored.

One source of truth for both methods:
- `llama-cpp`: floor(n / ctx) non-overlapping sequences, the first token of each replaced by
  BOS where BOS is used, only the second half scored (targets at ctx/2+1 .. ctx-1), as
  llama-perplexity does.
- `stride`: a sequence every `stride` tokens, each token scored once with the longest context
  available (the Hugging Face fixed-length recipe); the last sequence is aligned to the end.
Scored targets of sequence s are positions [lo[s], hi[s]), predicted from positions [lo-1, hi-1).
"""
from dataclasses import asdict, dataclass

import numpy as np

from ..errors import UserError

METHODS = ("llama-cpp", "stride", "hellaswag", "winogrande", "multiple-choice")   # modes/__init__.py: the mode of each


@dataclass(frozen=True)
class Method:
    name: str = "llama-cpp"
    ctx: int = 512
    stride: int = 0            # stride method only; 0 means ctx / 2
    unscored_prefix: int = -1  # llama-cpp only; -1 means ctx / 2 (the logits not scored)
    chunks: int = 0            # sequences kept from the start (--chunks), a choice method's tasks; 0: all
    bos: bool = False          # BOS at the corpus start, and (llama-cpp) at each sequence start

    def __post_init__(self):
        if self.name not in METHODS:
            raise UserError(f"unknown scoring method {self.name!r} (one of {', '.join(METHODS)})")
        if self.ctx < 4:
            raise UserError(f"--ctx must be at least 4, got {self.ctx}")
        if self.name != "stride" and self.stride:
            raise UserError("--stride applies to the stride method only (add --method stride)")
        if self.name != "llama-cpp" and self.unscored_prefix >= 0:
            raise UserError(f"--unscored-prefix applies to the llama-cpp method; the {self.name} method "
                            f"scores what it sets")
        if not 0 <= self.effective_stride <= self.ctx or not 0 <= self.effective_prefix < self.ctx - 1:
            raise UserError(f"--stride / --unscored-prefix must lie inside the context of {self.ctx}")
        if self.chunks < 0:
            raise UserError(f"--chunks must be >= 0, got {self.chunks}")

    @property
    def effective_stride(self) -> int:
        return self.stride or self.ctx // 2

    @property
    def effective_prefix(self) -> int:
        return self.ctx // 2 if self.unscored_prefix < 0 else self.unscored_prefix

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class SequencePlan:
    """The rows the trunk runs and the spans of targets the Score task scores in them. A corpus
    plan scores one span a row; a choice plan may pack a task's sequences in one row (`layout`):
    the tokens they share once, then each sequence's own tokens as a branch that sees the shared
    ones and itself only, its positions continuing from the shared ones' (llama-perplexity's
    sequence ids), and several tasks in a row, none seeing another."""
    ids: np.ndarray       # [rows, ctx] int32 model input
    score_lo: np.ndarray  # [spans] the first scored target position of each span, spans in plan order
    score_hi: np.ndarray  # [spans] one past its last
    available: int        # sequences the whole corpus gives before --chunks
    span_rows: np.ndarray | None = None   # [spans] the row of each span; None: span s is row s
    first_from: np.ndarray | None = None  # [spans] the position whose logits predict the span's first
                                          # target (a branch's: the shared tokens' last); None: lo - 1
    layout: np.ndarray | None = None      # [rows, ctx, LAYOUT_FIELDS] int32 of packed rows; None:
                                          # each row one sequence from position 0, causal

    @property
    def n_sequences(self) -> int:
        """Rows: what the trunk's chunks hold."""
        return self.ids.shape[0]

    @property
    def tokens_scored(self) -> int:
        return int((self.score_hi - self.score_lo).sum())

    def rows(self) -> np.ndarray:
        """[spans] the row of each span."""
        return np.arange(len(self.score_lo)) if self.span_rows is None else self.span_rows

    def sources(self) -> np.ndarray:
        """[spans] the position predicting each span's first target."""
        return self.score_lo - 1 if self.first_from is None else self.first_from

    def row_ends(self) -> np.ndarray:
        """[rows] one past the last position any span of the row scores (0: none)."""
        ends = np.zeros(self.n_sequences, dtype=np.int64)
        np.maximum.at(ends, self.rows(), self.score_hi)
        return ends

    def positions_computed(self, per_chunk: int) -> int:
        """Positions the trunk computes: each chunk of per_chunk rows up to its last scored one."""
        ends = self.row_ends()
        return sum(len(ends[a:a + per_chunk]) * int(ends[a:a + per_chunk].max())
                   for a in range(0, self.n_sequences, per_chunk))

    def spans_of(self, rows: range) -> list[tuple[int, int, int, int, int]]:
        """(span, row, lo, hi, first_from) of the spans in these rows, in plan order."""
        at = self.rows()
        keep = np.flatnonzero((at >= rows.start) & (at < rows.stop))
        src = self.sources()
        return [(int(s), int(at[s]), int(self.score_lo[s]), int(self.score_hi[s]), int(src[s])) for s in keep]


# a packed row's layout per position: its position in its sequence, its sequence in the row (no
# two see each other), its branch (0: shared by the sequence's branches; b > 0: seen by branch b only)
LAYOUT_FIELDS = ("position", "sequence", "branch")


def plan_sequences(tokens: np.ndarray, m: Method, bos_id: int | None, whole_sequences: bool = False) -> SequencePlan:
    """whole_sequences: the tokens are the sequences themselves (a llama.cpp base file's), however
    few, not a corpus of which llama-perplexity asks for two sequences at least."""
    tokens = np.asarray(tokens, dtype=np.int32)
    plan = _llama_cpp(tokens, m, bos_id, 1 if whole_sequences else 2) if m.name == "llama-cpp" else _stride(tokens, m)
    if m.chunks:
        plan = SequencePlan(plan.ids[:m.chunks], plan.score_lo[:m.chunks], plan.score_hi[:m.chunks], plan.available)
    return plan


def _llama_cpp(tokens: np.ndarray, m: Method, bos_id: int | None, least: int) -> SequencePlan:
    n = len(tokens) // m.ctx
    if n < least:
        raise UserError(f"the corpus has {len(tokens)} tokens; the llama-cpp method needs at least "
                        f"{least} * ctx = {least * m.ctx}")
    ids = tokens[:n * m.ctx].reshape(n, m.ctx).copy()
    if m.bos:
        ids[:, 0] = bos_id
    lo = np.full(n, m.effective_prefix + 1, dtype=np.int32)
    return SequencePlan(ids, lo, np.full(n, m.ctx, dtype=np.int32), n)


def _stride(tokens: np.ndarray, m: Method) -> SequencePlan:
    total, ctx, stride = len(tokens), m.ctx, m.effective_stride
    if total < ctx:
        raise UserError(f"the corpus has {total} tokens; the stride method needs at least ctx = {ctx}")
    starts = list(range(0, total - ctx + 1, stride))
    if starts[-1] + ctx < total:
        starts.append(total - ctx)
    ids = np.stack([tokens[s:s + ctx] for s in starts])
    done, lo = 1, []  # token 0 has nothing before it to predict it from
    for s in starts:
        lo.append(done - s)
        done = s + ctx
    return SequencePlan(ids, np.array(lo, dtype=np.int32), np.full(len(starts), ctx, dtype=np.int32), len(starts))
