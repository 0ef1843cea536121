"""Evaluation modes over the one trunk. A mode makes the plan of sequences (which targets of
each are scored, how sequences group into the items a score counts) and reduces the Score
task's per-token figures into its result; windows, boundaries, resume, placement, shards,
luigid and sweeps know no mode."""
from .base import Mode, ModePlan
from .choice import ChoiceMode
from .hellaswag import HellaSwag
from .multiple_choice import MultipleChoice
from .perplexity import KLDivergence, Perplexity
from .winogrande import Winogrande

# the mode of each scoring method (run/corpus_plan.py's Method.name)
BY_METHOD = {"llama-cpp": Perplexity, "stride": Perplexity, "hellaswag": HellaSwag, "winogrande": Winogrande,
             "multiple-choice": MultipleChoice}
CHOICE_METHODS = tuple(name for name, mode in BY_METHOD.items() if issubclass(mode, ChoiceMode))


def mode_of(method: str, kl_base: bool = False, numerics: str = "exact") -> Mode:
    mode = BY_METHOD[method]
    return (KLDivergence if kl_base and mode is Perplexity else mode)(numerics)


__all__ = ["Mode", "ModePlan", "ChoiceMode", "mode_of", "Perplexity", "KLDivergence", "HellaSwag", "Winogrande",
           "MultipleChoice", "CHOICE_METHODS"]
