"""What an evaluation mode is: the plan of sequences the trunk runs, and the reduction of the
Score task's per-token figures into the mode's result."""
from dataclasses import dataclass

import numpy as np

from ..corpus_plan import SequencePlan


@dataclass
class ModePlan:
    tokens: np.ndarray        # every token id the mode tokenized, in order (what --dump-tokens writes)
    sequences: SequencePlan   # the rows the trunk runs and which targets of each are scored
    attrs: dict               # what reduce() needs beside the per-token figures (JSON)


class Mode:
    """A mode knows no window, boundary or device: it sees the run's spec when it plans and
    the scored figures, in plan order, when it reduces."""
    name: str
    plan_version = 1      # of the plan's rows and attrs: a Tokenize output's identity names any later one

    def __init__(self, numerics: str = "exact"):
        self.numerics = numerics      # the run's (--numerics): a mode may score as llama-perplexity does in it

    @classmethod
    def packs(cls, spec) -> bool:
        """Whether its plan for this run packs sequences into rows (SequencePlan.layout)."""
        return False

    def plan(self, spec) -> ModePlan:
        raise NotImplementedError

    def reduce(self, scored: list[np.ndarray], attrs: dict) -> dict:
        """scored: per sequence, [scored targets, fields] float64 (fields: the NLL first, then
        figures.FIELDS' others with a KL base) -> the result's keys of this mode."""
        raise NotImplementedError

    def report_rows(self, result: dict) -> list[tuple[str, str]]:
        """The head of the report: the mode's figures, as (label, value) rows."""
        raise NotImplementedError

    def print_details(self, result: dict, per_sequence: bool) -> None:
        """What the mode prints after the report's table."""
