"""layercycle: perplexity of GGUF models larger than the device, one layer window at a time.

`luigi --module pipeline PerplexityRun` imports this package; importing it registers the tasks.
"""
from .flow.entry import PerplexityRun, Sweep
from .flow.score import Score
from .flow.trunk import Embed, LayerWindow, Tokenize

__all__ = ["Tokenize", "Embed", "LayerWindow", "Score", "PerplexityRun", "Sweep"]
